#!/bin/bash
# Kubernetes' control plane, kubelet and kubectl of one release, from the published
# k8s.io/kubernetes module (its staging modules replaced by their published v0.x versions
# in go.mod), into $OUT. The version is stamped as the release's own build stamps it.
set -euo pipefail
version=$(sed -n 's#^require k8s.io/kubernetes \(v[0-9.]*\)$#\1#p' go.mod)
minor=$(echo "$version" | cut -d. -f2)
flags="-s -w"
for pkg in k8s.io/client-go/pkg/version k8s.io/component-base/version; do
    flags="$flags -X $pkg.gitVersion=$version -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
    flags="$flags -X $pkg.gitTreeState=clean"
done
CGO_ENABLED=0 go build -trimpath -ldflags "$flags" -o "$OUT/" \
    k8s.io/kubernetes/cmd/kube-apiserver \
    k8s.io/kubernetes/cmd/kube-controller-manager \
    k8s.io/kubernetes/cmd/kube-scheduler \
    k8s.io/kubernetes/cmd/kubelet \
    k8s.io/kubernetes/cmd/kubectl
