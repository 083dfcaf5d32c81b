#!/bin/bash
# NVIDIA's k8s-device-plugin, built from its published Go module into $OUT (cgo: go-nvml
# dlopens libnvidia-ml), its version stamped as its Makefile does.
set -euo pipefail
version=$(sed -n 's#^\s*github.com/NVIDIA/k8s-device-plugin \(v[0-9.]*\).*#\1#p' go.mod)
CGO_ENABLED=1 CGO_CFLAGS="-O2 -Wno-deprecated-declarations" \
    go build -trimpath \
    -ldflags "-X github.com/NVIDIA/k8s-device-plugin/internal/info.version=$version" \
    -o "$OUT/" github.com/NVIDIA/k8s-device-plugin/cmd/nvidia-device-plugin
