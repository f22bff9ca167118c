package engine

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/containerd/errdefs"
	"github.com/opencontainers/go-digest"
	"golang.org/x/sys/unix"
	"hutch.dev/hutch/assembly"
	"hutch.dev/hutch/policy"
)

// Sandbox states, as List and Get report them.
const (
	// StateCreating: a create is under way (or its process died; rm
	// cleans it up).
	StateCreating = "creating"
	// StateRunning: the sandbox runs and accepts exec.
	StateRunning = "running"
	// StateStopped: the sandbox's processes are gone (stopped, or the
	// host rebooted); its record remains until rm.
	StateStopped = "stopped"
	// StatePaused: the sandbox's memory and filesystem are in a
	// checkpoint on disk and it has no processes; resume continues it.
	StatePaused = "paused"
)

// record is a sandbox's record on disk (sandbox.json): everything the
// engine keeps about it, host PIDs and paths included. Its State is
// computed when read. Callers outside the engine see its view, Sandbox.
type record struct {
	ID          string        `json:"id"`
	Name        string        `json:"name,omitempty"`
	Image       string        `json:"image"`
	ImageDigest digest.Digest `json:"imageDigest"`
	Created     time.Time     `json:"created"`
	State       string        `json:"state"`
	CPUs        float64       `json:"cpus"`
	Memory      int64         `json:"memory"`
	Pids        int64         `json:"pids"`
	Disk        int64         `json:"disk"`
	Network     string        `json:"network"`
	Allow       []string      `json:"allow,omitempty"`
	DNS         []string      `json:"dns,omitempty"`
	// NetRate limits what the sandbox sends, in bits per second.
	NetRate int64 `json:"netRate,omitempty"`
	// Docker: the sandbox was created with what a Docker daemon inside
	// needs (policy.Request.Docker); runsc runs it with --net-raw.
	Docker bool `json:"docker,omitempty"`
	// Linked: the sandbox has a network link (it was created with a
	// network mode other than none; an update to none firewalls it shut).
	Linked bool `json:"linked,omitempty"`
	// IP is the sandbox's address on its link.
	IP string `json:"ip,omitempty"`
	// Mounts are the host directories and volumes mounted into the
	// sandbox, as the create asked for them.
	Mounts   []Mount           `json:"mounts,omitempty"`
	Env      []string          `json:"env,omitempty"`
	Workdir  string            `json:"workdir"`
	Labels   map[string]string `json:"labels,omitempty"`
	Rootless bool              `json:"rootless"`
	// Unenforced names the limits of a rootless sandbox that nothing
	// enforces; Cgroup is its cgroup in the user's delegated subtree
	// (relative to the cgroup2 mount), if it has one.
	Unenforced []string `json:"unenforced,omitempty"`
	Cgroup     string   `json:"cgroup,omitempty"`
	// Rootfs is the image's shared read-only root filesystem.
	Rootfs string `json:"rootfs,omitempty"`
	// ImageEnv and ImageWorkdir are the image's, for every exec.
	ImageEnv     []string `json:"imageEnv,omitempty"`
	ImageWorkdir string   `json:"imageWorkdir,omitempty"`
	ImageUser    string   `json:"imageUser,omitempty"`
	// Pid is the host PID of the gVisor sandbox process while it runs.
	Pid int `json:"pid,omitempty"`

	// Liveness of Pid: its start time and the boot it belongs to, so a
	// reused PID or a reboot is never mistaken for the sandbox.
	PidStart   uint64 `json:"pidStart,omitempty"`
	BootID     string `json:"bootID,omitempty"`
	CreatorPid int    `json:"creatorPid,omitempty"`
	Stopped    bool   `json:"stopped,omitempty"`
	// Teardown: a pause recorded the sandbox's checkpoint and killed its
	// sandbox process, and the rest of its runtime is still to be
	// removed (FinishPause).
	Teardown bool `json:"teardown,omitempty"`
	// The detached process that ends a pause (FinishPause).
	FinisherPid   int    `json:"finisherPid,omitempty"`
	FinisherStart uint64 `json:"finisherStart,omitempty"`
	// The DNS resolver process of a sandbox with a network.
	ResolverPid   int    `json:"resolverPid,omitempty"`
	ResolverStart uint64 `json:"resolverStart,omitempty"`

	// Secrets are the names of the sandbox's secrets; their values are
	// only inside the sandbox (docs/security.md).
	Secrets []string `json:"secrets,omitempty"`
	// Inject are the egress gateway's inject rules, with the placeholder
	// each env rule's variable holds.
	Inject []policy.InjectRule `json:"inject,omitempty"`
	// CACerts are the certificates the sandbox trusts besides its
	// image's (--ca-cert and the state root's): subject and SHA-256.
	CACerts []string `json:"caCerts,omitempty"`
	// OOMKilled: the host's OOM killer ended the sandbox when it reached
	// its memory limit.
	OOMKilled bool `json:"oomKilled,omitempty"`
	// OneShot: the sandbox's init is one command (Run), with the host's
	// pipes as its stdio, and the sandbox stops with it: it cannot be
	// checkpointed and takes no background exec.
	OneShot bool `json:"oneShot,omitempty"`

	// Ports are the published ports, with the host ports they got, and
	// Forwarder the detached process that serves them.
	Ports     []PortMapping `json:"ports,omitempty"`
	Forwarder *ForwarderRef `json:"forwarder,omitempty"`

	// Persistence: pause/resume, fork, setup cache and lifetime.
	PersistState
}

// ShortID is the 12-character form of the ID.
func (s *record) ShortID() string { return shortID(s.ID) }

// nameRE leaves the length to checkName: a bounded repetition is a large
// compile at every process start.
var nameRE = regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9_.-]*$`)

// checkName validates a sandbox name.
func checkName(n string) error {
	if len(n) > 63 || !nameRE.MatchString(n) {
		return fmt.Errorf("sandbox name %q: want 1-63 of [a-zA-Z0-9_.-], starting with a letter or digit: %w", n, errdefs.ErrInvalidArgument)
	}
	if isHex(n) && len(n) >= 12 {
		return fmt.Errorf("sandbox name %q looks like an ID: %w", n, errdefs.ErrInvalidArgument)
	}
	return nil
}

func isHex(s string) bool {
	for _, c := range s {
		if !strings.ContainsRune("0123456789abcdef", c) {
			return false
		}
	}
	return s != ""
}

func newID() (string, error) {
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	return hex.EncodeToString(b), nil
}

// lockFile takes an exclusive flock on path, creating it. The returned
// function releases it.
func lockFile(path string) (func(), error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, err
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX); err != nil {
		f.Close()
		return nil, err
	}
	return func() { f.Close() }, nil
}

// lockSandbox serializes state changes (stop, rm) of one sandbox.
func (e *Engine) lockSandbox(id string) (func(), error) {
	return lockFile(filepath.Join(e.sandboxDir(id), "lock"))
}

// getLocked resolves ref, locks the sandbox and re-reads its record under
// the lock. The caller must call unlock.
func (e *Engine) getLocked(ctx context.Context, ref string) (sb *record, unlock func(), err error) {
	if sb, err = e.get(ctx, ref); err != nil {
		return nil, nil, err
	}
	if unlock, err = e.lockSandbox(sb.ID); err != nil {
		return nil, nil, err
	}
	if sb, err = e.load(sb.ID); err != nil {
		unlock()
		return nil, nil, err
	}
	return sb, unlock, nil
}

// lockNames serializes name allocation across processes.
func (e *Engine) lockNames() (func(), error) {
	return lockFile(filepath.Join(e.opts.Root, "names.lock"))
}

func (e *Engine) recordPath(id string) string {
	return filepath.Join(e.sandboxDir(id), "sandbox.json")
}

// save writes sb's record atomically, readable by its owner only.
func (e *Engine) save(sb *record) error {
	b, err := json.MarshalIndent(sb, "", "  ")
	if err != nil {
		return err
	}
	tmp := e.recordPath(sb.ID) + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, e.recordPath(sb.ID))
}

// load reads sandbox id's record and computes its state.
func (e *Engine) load(id string) (*record, error) {
	var sb record
	if err := readJSON(e.recordPath(id), &sb, "sandbox "+id, "sandbox "+id+": corrupt record"); err != nil {
		return nil, err
	}
	sb.State = e.state(&sb)
	e.checkOOM(&sb)
	return &sb, nil
}

// state computes a sandbox's state from its record and the host: a
// sandbox runs while its gVisor process does.
func (e *Engine) state(sb *record) string {
	switch {
	case sb.Paused:
		return StatePaused
	case sb.Stopped:
		return StateStopped
	case sb.Pid == 0:
		if sb.CreatorPid != 0 && processAlive(sb.CreatorPid) {
			return StateCreating
		}
		return StateStopped
	case sb.BootID != bootID():
		return StateStopped
	}
	if !assembly.SameProcess(sb.Pid, sb.PidStart) {
		return StateStopped
	}
	return StateRunning
}

func processAlive(pid int) bool {
	err := unix.Kill(pid, 0)
	return err == nil || errors.Is(err, unix.EPERM)
}

// bootID is the host's boot ID, read once per process: state compares
// every record with it, and it cannot change under a running process.
var bootID = sync.OnceValue(func() string {
	b, _ := os.ReadFile("/proc/sys/kernel/random/boot_id")
	return strings.TrimSpace(string(b))
})

// List returns every sandbox, oldest first.
func (e *Engine) List(ctx context.Context) ([]*Sandbox, error) {
	recs, err := e.list(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]*Sandbox, len(recs))
	for i, r := range recs {
		out[i] = r.view()
	}
	return out, nil
}

// Get resolves ref (an ID, a unique ID prefix, or a name) to a sandbox.
func (e *Engine) Get(ctx context.Context, ref string) (*Sandbox, error) {
	sb, err := e.get(ctx, ref)
	return sb.view(), err
}

// list returns every sandbox's record, oldest first.
func (e *Engine) list(ctx context.Context) ([]*record, error) {
	ents, err := os.ReadDir(e.sandboxesDir())
	if err != nil {
		return nil, err
	}
	var out []*record
	for _, ent := range ents {
		if !ent.IsDir() {
			continue
		}
		sb, err := e.load(ent.Name())
		if err != nil {
			if errors.Is(err, errdefs.ErrNotFound) {
				// Being created or removed right now, or a removal
				// whose remover died.
				e.collectRemoving(ctx, ent.Name())
				continue
			}
			return nil, err
		}
		out = append(out, sb)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Created.Before(out[j].Created) })
	return out, nil
}

// get resolves ref (an ID, a unique ID prefix, or a name) to a
// sandbox's record.
func (e *Engine) get(ctx context.Context, ref string) (*record, error) {
	if ref == "" {
		return nil, fmt.Errorf("empty sandbox ID: %w", errdefs.ErrInvalidArgument)
	}
	if strings.ContainsAny(ref, "/\x00") || ref == "." || ref == ".." {
		return nil, fmt.Errorf("sandbox %q: not a valid ID or name: %w", ref, errdefs.ErrInvalidArgument)
	}
	if sb, err := e.load(ref); err == nil {
		return sb, nil
	}
	if id, err := e.nameOwner(ref); err != nil {
		return nil, err
	} else if id != "" {
		return e.load(id)
	}
	// An ID prefix (or a name the index lacks): only the matching record
	// is loaded.
	all, err := e.names()
	if err != nil {
		return nil, err
	}
	var matches []string
	for _, n := range all {
		if n.Name == ref {
			return e.load(n.ID)
		}
		if strings.HasPrefix(n.ID, ref) {
			matches = append(matches, n.ID)
		}
	}
	switch len(matches) {
	case 0:
		return nil, fmt.Errorf("no such sandbox: %s: %w", ref, errdefs.ErrNotFound)
	case 1:
		return e.load(matches[0])
	}
	return nil, fmt.Errorf("sandbox ID %q is ambiguous: it matches %d sandboxes: %w", ref, len(matches), errdefs.ErrInvalidArgument)
}

// nameEntry is what name and ID-prefix lookups read of a record.
type nameEntry struct {
	ID   string `json:"-"`
	Name string `json:"name"`
}

// names reads every sandbox's name from its record, without computing
// its state as list does: the host's /proc and cgroups are not read.
func (e *Engine) names() ([]nameEntry, error) {
	ents, err := os.ReadDir(e.sandboxesDir())
	if err != nil {
		return nil, err
	}
	out := make([]nameEntry, 0, len(ents))
	for _, ent := range ents {
		if !ent.IsDir() {
			continue
		}
		n := nameEntry{ID: ent.Name()}
		err := readJSON(e.recordPath(n.ID), &n, "sandbox "+n.ID, "sandbox "+n.ID+": corrupt record")
		if errdefs.IsNotFound(err) {
			continue // being created or removed right now
		}
		if err != nil {
			return nil, err
		}
		out = append(out, n)
	}
	return out, nil
}
