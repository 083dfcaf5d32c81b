#!/bin/bash
# NRI's api.proto from the published github.com/containerd/nri module, at the tag go.mod pins
# (the one containerd v2.4.2 vendors), into $OUT: the source nvshim/agent/nri/api_pb2.py is
# generated from (tests/helpers/nriproto.py). Only the module cache holds NRI's source.
set -euo pipefail
go mod download github.com/containerd/nri
dir=$(go list -m -f '{{.Dir}}' github.com/containerd/nri)
cp "$dir/pkg/api/api.proto" "$OUT/api.proto"
chmod 0644 "$OUT/api.proto"
