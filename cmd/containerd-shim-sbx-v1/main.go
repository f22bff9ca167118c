// Command containerd-shim-sbx-v1 is the containerd runtime v2 shim that runs
// tasks in gVisor sandboxes under sbx policy (runtime type io.containerd.sbx.v1).
package main

import (
	"context"

	cshim "github.com/containerd/containerd/v2/pkg/shim"

	"sbx.dev/sbx/shim"
)

func main() {
	cshim.RunShim(context.Background(), shim.NewManager(shim.RuntimeName), shim.Opts)
}
