// etcd, built from the published go.etcd.io/etcd/server/v3 module: its etcdmain is the
// etcd command's whole body.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
