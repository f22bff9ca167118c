package runsc

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strconv"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// StartOpts are the options of StartIO.
type StartOpts struct {
	// Stdio of a subcontainer's init: runsc hands its own stdio to the
	// sandbox when it starts a container that joins an existing sandbox.
	// nil means /dev/null. A root container's stdio is given to Create.
	Stdin, Stdout, Stderr *os.File
}

// StartIO starts the init of a created container with the stdio in o.
func (r *Runsc) StartIO(ctx context.Context, id string, o StartOpts) error {
	cmd := r.command(ctx, "start", id)
	devnull, err := os.Open(os.DevNull)
	if err != nil {
		return err
	}
	defer devnull.Close()
	cmd.Stdin, cmd.Stdout = orFile(o.Stdin, devnull), orFile(o.Stdout, devnull)
	if o.Stderr != nil {
		cmd.Stderr = o.Stderr
		if err := cmd.Run(); err != nil {
			return r.wrapErr("start", err, nil)
		}
		return nil
	}
	errf, err := os.CreateTemp("", "hutch-runsc-start-")
	if err != nil {
		return err
	}
	defer os.Remove(errf.Name())
	defer errf.Close()
	cmd.Stderr = errf
	if err := cmd.Run(); err != nil {
		return r.wrapErr("start", err, errf)
	}
	return nil
}

// Pause freezes every process of the container.
func (r *Runsc) Pause(ctx context.Context, id string) error {
	_, err := r.run(ctx, "pause", id)
	return err
}

// Resume thaws a paused container.
func (r *Runsc) Resume(ctx context.Context, id string) error {
	_, err := r.run(ctx, "resume", id)
	return err
}

// Update applies new resource limits to a running container.
func (r *Runsc) Update(ctx context.Context, id string, res *specs.LinuxResources) error {
	b, err := json.Marshal(res)
	if err != nil {
		return err
	}
	f, err := os.CreateTemp("", "hutch-runsc-resources-")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name())
	if _, err := f.Write(b); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	_, err = r.run(ctx, "update", "--resources", f.Name(), id)
	return err
}

// Stats is the usage gVisor's kernel accounts for a container, as `runsc
// events --stats` reports it.
type Stats struct {
	CPU struct {
		Usage struct {
			Total  uint64   `json:"total"`
			PerCPU []uint64 `json:"percpu"`
		} `json:"usage"`
	} `json:"cpu"`
	Memory struct {
		Usage struct {
			Limit   uint64 `json:"limit"`
			Usage   uint64 `json:"usage"`
			Max     uint64 `json:"max"`
			Failcnt uint64 `json:"failcnt"`
		} `json:"usage"`
	} `json:"memory"`
	Pids struct {
		Current uint64 `json:"current"`
		Limit   uint64 `json:"limit"`
	} `json:"pids"`
}

// Stats returns the container's usage inside the sandbox.
func (r *Runsc) Stats(ctx context.Context, id string) (*Stats, error) {
	out, err := r.run(ctx, "events", "--stats", id)
	if err != nil {
		return nil, err
	}
	var ev struct {
		Data Stats `json:"data"`
	}
	if err := json.Unmarshal(out, &ev); err != nil {
		return nil, fmt.Errorf("runsc events %s: %w", id, err)
	}
	return &ev.Data, nil
}

// HostPids are the host processes runsc runs for one container.
type HostPids struct {
	// Sandbox is the sandbox (sentry) process, shared by every container
	// of the sandbox.
	Sandbox int
	// Gofer serves the container's filesystem; 0 if it has none.
	Gofer int
}

// HostPids reads the host PIDs of container id from runsc's state, so that
// a caller that inherits them (a subreaper) can wait for them.
func (r *Runsc) HostPids(id string) (HostPids, error) {
	var st struct {
		GoferPid json.RawMessage `json:"goferPid"`
		Sandbox  struct {
			Pid json.RawMessage `json:"pid"`
		} `json:"sandbox"`
	}
	if err := r.readState(id, &st); err != nil {
		return HostPids{}, err
	}
	return HostPids{Sandbox: atoiJSON(st.Sandbox.Pid), Gofer: atoiJSON(st.GoferPid)}, nil
}

// atoiJSON reads a PID that runsc stores as a number or an atomic wrapper
// ({"v": N} in some versions).
func atoiJSON(b json.RawMessage) int {
	if n, err := strconv.Atoi(string(b)); err == nil {
		return n
	}
	var w map[string]int
	if json.Unmarshal(b, &w) == nil {
		for _, v := range w {
			return v
		}
	}
	return 0
}
