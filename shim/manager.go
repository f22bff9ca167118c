package shim

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"

	bootapi "github.com/containerd/containerd/api/runtime/bootstrap/v1"
	"github.com/containerd/containerd/api/types"
	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/containerd/v2/defaults"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	cshim "github.com/containerd/containerd/v2/pkg/shim"
	"github.com/containerd/containerd/v2/pkg/shutdown"
	"github.com/containerd/containerd/v2/plugins"
	"github.com/containerd/log"
	"github.com/containerd/plugin"
	"github.com/containerd/plugin/registry"

	"hutch.dev/hutch/assembly"
	"hutch.dev/hutch/runsc"
)

// RuntimeName is the runtime type containerd knows the shim by.
const RuntimeName = "io.containerd.hutch.v1"

// Version is the shim's version, set at build time.
var Version = "dev"

func init() {
	registry.Register(&plugin.Registration{
		Type:     plugins.TTRPCPlugin,
		ID:       "task",
		Requires: []plugin.Type{plugins.EventPlugin, plugins.InternalPlugin},
		InitFn: func(ic *plugin.InitContext) (any, error) {
			pp, err := ic.GetByID(plugins.EventPlugin, "publisher")
			if err != nil {
				return nil, err
			}
			ss, err := ic.GetByID(plugins.InternalPlugin, "shutdown")
			if err != nil {
				return nil, err
			}
			return NewTaskService(ic.Context, pp.(cshim.Publisher), ss.(shutdown.Service))
		},
	})
}

// Opts are the shim library options the shim needs: it reaps only the
// processes it knows (the sandbox and gofers, which a subreaper inherits
// from `runsc create`), so that its own runsc commands keep their exit
// statuses.
func Opts(c *cshim.Config) { c.NoReaper = true }

// Manager starts and cleans up shim processes (containerd's bootstrap
// protocol). One shim serves one pod: containers that name a CRI sandbox
// ID reach the shim of that sandbox.
type Manager struct{ name string }

// NewManager returns the manager for runtime type name.
func NewManager(name string) *Manager { return &Manager{name: name} }

// Name is the runtime type.
func (m *Manager) Name() string { return m.name }

// Start starts the shim process for a task, or returns the address of the
// pod's running shim.
func (m *Manager) Start(ctx context.Context, opts *bootapi.BootstrapParams) (_ *bootapi.BootstrapResult, retErr error) {
	id := opts.GetInstanceID()
	ns, err := namespaces.NamespaceRequired(ctx)
	if err != nil {
		return nil, err
	}
	group := id
	if spec, err := runsc.ReadBundle("."); err == nil {
		if sb, ok := spec.Annotations[criSandboxID]; ok && sb != "" {
			group = sb
		}
	}
	socketDir := opts.GetSocketDir()
	if socketDir == "" {
		socketDir = filepath.Join(defaults.DefaultStateDir, "s")
	}
	result := &bootapi.BootstrapResult{Version: 3, Protocol: "ttrpc"}
	address, err := cshim.CreateSocketAddress(ctx, socketDir, opts.GetContainerdGrpcAddress(), group, false)
	if err != nil {
		return nil, err
	}
	sock, err := cshim.NewSocket(address)
	if err != nil {
		if !cshim.SocketEaddrinuse(err) {
			return nil, fmt.Errorf("shim socket: %w", err)
		}
		if cshim.CanConnect(address) {
			// The pod's shim runs: this container joins it.
			result.Address = address
			return result, nil
		}
		if err := cshim.RemoveSocket(address); err != nil {
			return nil, fmt.Errorf("remove stale socket: %w", err)
		}
		if sock, err = cshim.NewSocket(address); err != nil {
			return nil, fmt.Errorf("shim socket: %w", err)
		}
	}
	defer func() {
		if retErr != nil {
			sock.Close()
			cshim.RemoveSocket(address) //nolint:errcheck // best effort
		}
	}()
	f, err := sock.File()
	if err != nil {
		return nil, err
	}
	defer f.Close()

	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cwd, err := os.Getwd()
	if err != nil {
		return nil, err
	}
	args := []string{"-namespace", ns, "-id", id, "-address", opts.GetContainerdGrpcAddress()}
	if opts.GetLogLevel() <= bootapi.LogLevel_LOG_LEVEL_DEBUG {
		args = append(args, "-debug")
	}
	cmd := exec.Command(self, args...)
	cmd.Dir = cwd
	cmd.Env = append(os.Environ(), "GOMAXPROCS=4")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.ExtraFiles = []*os.File{f}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	go cmd.Wait() //nolint:errcheck // the shim outlives this process
	if err := cshim.AdjustOOMScore(cmd.Process.Pid); err != nil {
		cmd.Process.Kill() //nolint:errcheck // failing anyway
		return nil, fmt.Errorf("adjust the shim's OOM score: %w", err)
	}
	result.Address = address
	return result, nil
}

// Stop cleans up after a task whose shim is gone (`shim delete`): runsc's
// state and processes, the rootfs mount, and for the sandbox container the
// pod's host set-up. It runs in the task's bundle.
func (m *Manager) Stop(ctx context.Context, id string) (cshim.StopStatus, error) {
	cwd, err := os.Getwd()
	if err != nil {
		return cshim.StopStatus{}, err
	}
	bundle := filepath.Join(filepath.Dir(cwd), id)
	rec, err := readRecord(bundle)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return cshim.StopStatus{}, err
	}
	if rec != nil {
		r := rec.Runsc
		var leftovers runsc.HostPids
		if rec.Root {
			leftovers, _ = r.HostPids(id)
		}
		if err := r.Delete(ctx, id, true); err != nil {
			log.G(ctx).WithError(err).Warn("delete runsc container")
		}
		if rec.Root {
			killLeftovers(leftovers)
		}
		if spec, err := runsc.ReadBundle(bundle); err == nil {
			if err := removeContainerCgroup(spec); err != nil {
				log.G(ctx).WithError(err).Warn("remove cgroup")
			}
		}
		if rec.Root {
			if rec.Linked {
				if err := assembly.TeardownNetwork(ctx, rec.SandboxID, nil, false); err != nil {
					log.G(ctx).WithError(err).Warn("tear down pod network")
				}
			}
			if rec.Egress != nil {
				if err := assembly.ReleasePodEgress(ctx, *rec.Egress); err != nil {
					log.G(ctx).WithError(err).Warn("release the pod's egress")
				}
			}
			if rec.StateDir != "" {
				os.RemoveAll(rec.StateDir)
			}
			if rec.Cgroup != "" {
				if err := assembly.RemoveCgroup(rec.Cgroup); err != nil {
					log.G(ctx).WithError(err).Warn("remove the sandbox's cgroup")
				}
			}
		}
	}
	if err := mount.UnmountRecursive(filepath.Join(bundle, "rootfs"), 0); err != nil {
		log.G(ctx).WithError(err).Warn("unmount rootfs")
	}
	return cshim.StopStatus{ExitedAt: time.Now(), ExitStatus: exitLost}, nil
}

// killLeftovers kills a sandbox's processes that `runsc delete` left
// running (if runsc's state was already gone): they would hold the rootfs
// mount and the cgroup.
func killLeftovers(hp runsc.HostPids) {
	for _, pid := range []int{hp.Sandbox, hp.Gofer} {
		if pid > 0 && syscall.Kill(pid, 0) == nil {
			syscall.Kill(pid, syscall.SIGKILL) //nolint:errcheck // may be gone
		}
	}
}

// Info reports the runtime's name and version.
func (m *Manager) Info(ctx context.Context, optionsR io.Reader) (*types.RuntimeInfo, error) {
	return &types.RuntimeInfo{Name: m.name, Version: &types.RuntimeVersion{Version: Version}}, nil
}
