// Command etcd is etcd's server at the version Kubernetes pins, built in the
// same module so that etcd and gRPC stay at Kubernetes' versions.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
