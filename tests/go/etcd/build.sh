#!/bin/bash
# etcd (the version go.mod requires) into $OUT.
set -euo pipefail
CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$OUT/etcd" .
