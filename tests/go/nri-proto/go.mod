module nvshim.test/nri-proto

go 1.26.6

require github.com/containerd/nri v0.12.3
