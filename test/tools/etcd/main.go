// Command etcd is upstream etcd (go.etcd.io/etcd/server/v3) built from the Go module proxy,
// for liken's API-tier tests: this file only calls etcd's own main.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
