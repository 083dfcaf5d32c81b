#!/bin/bash
# nri-stub, our main.go around pkg/stub of the published github.com/containerd/nri module at
# the tag go.mod pins (v0.6.1, the NRI Debian 13's containerd 1.7.24 is built with; sid's
# containerd 2.1.9 has v0.8.0, which speaks the same protocol), into $OUT: the cheapest
# external NRI plugin, for bench/nri.py's stub modes. Only the module cache holds NRI's source.
set -euo pipefail
CGO_ENABLED=0 go build -trimpath -o "$OUT/nri-stub" .
