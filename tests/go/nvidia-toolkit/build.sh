#!/bin/bash
# NVIDIA's container toolkit, built from its published Go module into $OUT:
# nvidia-container-runtime, nvidia-ctk and nvidia-cdi-hook (cgo: go-nvml dlopens
# libnvidia-ml), and nvidia-nri, our main.go around the NRI plugin that
# nvidia-ctk-installer --enable-nri-plugin starts.
set -euo pipefail
version=$(sed -n 's#^require github.com/NVIDIA/nvidia-container-toolkit \(v[0-9.]*\)$#\1#p' go.mod)
# the version as NVIDIA's Makefile stamps it (--version says "unknown" otherwise)
flags="-X github.com/NVIDIA/nvidia-container-toolkit/internal/info.version=${version#v}"
CGO_ENABLED=0 go build -trimpath -o "$OUT/nvidia-nri" .
# go-nvml's cgo preamble names NVML calls NVIDIA has deprecated: quiet gcc's warnings
CGO_ENABLED=1 CGO_CFLAGS="-O2 -Wno-deprecated-declarations" \
    go build -trimpath -ldflags "$flags" -o "$OUT/" \
    github.com/NVIDIA/nvidia-container-toolkit/cmd/nvidia-container-runtime \
    github.com/NVIDIA/nvidia-container-toolkit/cmd/nvidia-ctk \
    github.com/NVIDIA/nvidia-container-toolkit/cmd/nvidia-cdi-hook
