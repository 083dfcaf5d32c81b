#!/bin/bash
# NVIDIA's NRI plugin (nvidia-container-toolkit's, built from its module) into $OUT.
set -euo pipefail
CGO_ENABLED=0 go build -trimpath -o "$OUT/nvidia-nri" .
