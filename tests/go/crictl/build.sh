#!/bin/bash
# crictl from the published sigs.k8s.io/cri-tools module into $OUT, its version stamped.
set -euo pipefail
version=$(sed -n 's#^require sigs.k8s.io/cri-tools v\([0-9.]*\)$#\1#p' go.mod)
CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X sigs.k8s.io/cri-tools/pkg/version.Version=$version" \
    -o "$OUT/" sigs.k8s.io/cri-tools/cmd/crictl
