#!/bin/bash
# containerd, ctr and the runc shim from the published containerd/v2 module into $OUT,
# with the tags containerd's own release uses (the shim static, without gRPC).
set -euo pipefail
pkg=github.com/containerd/containerd/v2
version=$(sed -n 's#^require github.com/containerd/containerd/v2 \(v[0-9.]*\)$#\1#p' go.mod)
flags="-s -w -X $pkg/version.Version=$version -X $pkg/version.Package=github.com/containerd/containerd"
go build -trimpath -tags urfave_cli_no_docs -ldflags "$flags" -o "$OUT/" \
    "$pkg/cmd/containerd" "$pkg/cmd/ctr"
CGO_ENABLED=0 go build -trimpath -tags "urfave_cli_no_docs no_grpc" -ldflags "$flags" \
    -o "$OUT/" "$pkg/cmd/containerd-shim-runc-v2"
