package clix

import (
	"fmt"
	"strconv"

	"github.com/urfave/cli/v2"

	"hutch.dev/hutch/engine"
)

// Limits reads the --cpus, --memory, --disk and --pids flags of c into
// req, marking those given (but --disk) as explicit.
func Limits(c *cli.Context, req *engine.CreateRequest) error {
	if s := c.String("cpus"); s != "" {
		cpus, err := strconv.ParseFloat(s, 64)
		if err != nil {
			return UsageError(fmt.Errorf("--cpus %q: want a number of cores", s))
		}
		req.CPUs, req.Explicit = cpus, append(req.Explicit, "cpus")
	}
	for _, f := range []struct {
		name string
		dst  *int64
	}{{"memory", &req.Memory}, {"disk", &req.Disk}} {
		if s := c.String(f.name); s != "" {
			n, err := engine.ParseSize(s)
			if err != nil {
				return UsageError(fmt.Errorf("--%s: %w", f.name, err))
			}
			*f.dst = n
			if f.name != "disk" {
				req.Explicit = append(req.Explicit, f.name)
			}
		}
	}
	if s := c.String("pids"); s != "" {
		pids, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return UsageError(fmt.Errorf("--pids %q: want a whole number", s))
		}
		req.Pids, req.Explicit = pids, append(req.Explicit, "pids")
	}
	return nil
}

// DockerFlag is --docker on create, run and pool create.
var DockerFlag = &cli.BoolFlag{
	Name:  "docker",
	Usage: "run a Docker daemon inside the sandbox (default image " + engine.DockerImage + "): grants the sandbox every capability of gVisor's kernel, mounts, namespaces and raw sockets inside it (docs/docker.md)",
}
