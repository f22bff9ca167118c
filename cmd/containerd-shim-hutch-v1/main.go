// Command containerd-shim-hutch-v1 is the containerd runtime v2 shim that runs
// tasks in gVisor sandboxes under hutch policy (runtime type io.containerd.hutch.v1).
package main

import (
	"context"

	cshim "github.com/containerd/containerd/v2/pkg/shim"

	"hutch.dev/hutch/shim"
)

func main() {
	cshim.RunShim(context.Background(), shim.NewManager(shim.RuntimeName), shim.Opts)
}
