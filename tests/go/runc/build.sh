#!/bin/bash
# runc from the published opencontainers/runc module into $OUT: cgo (its nsenter is C) and
# seccomp (libseccomp-dev), as runc's release builds it, but without libpathrs (not
# packaged here: runc then uses its Go fallback for safe path resolution).
set -euo pipefail
version=$(sed -n 's#^require github.com/opencontainers/runc \(v[0-9.]*\)$#\1#p' go.mod)
CGO_ENABLED=1 go build -trimpath -tags "seccomp urfave_cli_no_docs" \
    -ldflags "-s -w -X main.version=${version#v}" -o "$OUT/runc" github.com/opencontainers/runc
