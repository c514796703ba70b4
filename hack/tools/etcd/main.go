// Command etcd is etcd's own server main, built from the pinned module so the
// test stack needs no downloaded binary.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
