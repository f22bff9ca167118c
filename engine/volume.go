package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"hutch.dev/hutch/policy"
	"hutch.dev/hutch/runsc"
)

// Mount is a directory of the host, or a named volume, mounted into a
// sandbox at Target. Exactly one of Source (an absolute host path) and
// Volume (a volume's name) is set.
//
// A host Source is resolved once, at create, with its symlinks followed;
// the sandbox then sees that directory even if the path changes later.
// Writes to a mount, from the host or from other sandboxes, are seen by
// every sandbox that mounts it (docs/decisions/0013-volumes.md). Mounts
// are not part of snapshots: pause/resume and fork keep them as they are.
//
// Overlay (a host Source only, as root) makes the mount a workspace: the
// sandbox sees the host directory but its writes go to a layer of its
// own, which Diff shows and ApplyDiff copies to the host directory when
// asked (docs/decisions/0016-overlay-workspaces.md). A fork gets a copy
// of its parent's layer.
type Mount struct {
	Source   string `json:"source,omitempty"`
	Volume   string `json:"volume,omitempty"`
	Target   string `json:"target"`
	ReadOnly bool   `json:"readOnly,omitempty"`
	Overlay  bool   `json:"overlay,omitempty"`
}

// Volume is a named volume: a directory under the state root that
// outlives the sandboxes that mount it.
type Volume struct {
	Name    string    `json:"name"`
	Created time.Time `json:"created"`
	// Path is the host directory holding the volume's files.
	Path string `json:"path"`
	// UsedBy are the IDs of the sandboxes that mount the volume.
	UsedBy []string `json:"usedBy,omitempty"`
}

func (e *Engine) volumesDir() string { return filepath.Join(e.opts.Root, "volumes") }

func (e *Engine) volumeDir(name string) string { return filepath.Join(e.volumesDir(), name) }

// volumeData is where a volume's files are.
func (e *Engine) volumeData(name string) string { return filepath.Join(e.volumeDir(name), "data") }

// lockVolumes takes the volumes lock: shared by creates from the moment
// their mounts are resolved until their bundle is written, exclusive for
// volume removal, so that a volume cannot be removed under a create.
func (e *Engine) lockVolumes(how int) (func(), error) {
	if err := os.MkdirAll(e.volumesDir(), 0o700); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(filepath.Join(e.volumesDir(), ".lock"), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, err
	}
	if err := unix.Flock(int(f.Fd()), how); err != nil {
		f.Close()
		return nil, err
	}
	return func() { f.Close() }, nil
}

// CreateVolume creates the named volume name. Its directory is writable by
// every user of the sandboxes that mount it.
func (e *Engine) CreateVolume(ctx context.Context, name string) (Volume, error) {
	if err := policy.CheckVolumeName(name); err != nil {
		return Volume{}, err
	}
	unlock, err := e.lockVolumes(unix.LOCK_EX)
	if err != nil {
		return Volume{}, err
	}
	defer unlock()
	dir := e.volumeDir(name)
	if err := os.Mkdir(dir, 0o711); err != nil {
		if errors.Is(err, os.ErrExist) {
			return Volume{}, fmt.Errorf("volume %q: %w", name, errdefs.ErrAlreadyExists)
		}
		return Volume{}, err
	}
	v := Volume{Name: name, Created: time.Now().UTC(), Path: e.volumeData(name)}
	err = func() error {
		if err := os.Mkdir(v.Path, 0o777); err != nil {
			return err
		}
		// Not subject to the umask: sandboxes' non-root users write too.
		if err := os.Chmod(v.Path, 0o777); err != nil {
			return err
		}
		b, err := json.Marshal(struct {
			Created time.Time `json:"created"`
		}{v.Created})
		if err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(dir, "volume.json"), b, 0o600)
	}()
	if err != nil {
		os.RemoveAll(dir)
		return Volume{}, fmt.Errorf("create volume %q: %w", name, err)
	}
	return v, nil
}

// InspectVolume returns the named volume and the sandboxes that use it.
func (e *Engine) InspectVolume(ctx context.Context, name string) (Volume, error) {
	if err := policy.CheckVolumeName(name); err != nil {
		return Volume{}, err
	}
	users, err := e.volumeUsers()
	if err != nil {
		return Volume{}, err
	}
	return e.loadVolume(name, users)
}

func (e *Engine) loadVolume(name string, users map[string][]string) (Volume, error) {
	var rec struct {
		Created time.Time `json:"created"`
	}
	if err := readJSON(filepath.Join(e.volumeDir(name), "volume.json"), &rec,
		fmt.Sprintf("no such volume: %s (create it with `hutch volume create %s`)", name, name),
		fmt.Sprintf("volume %q: bad record", name)); err != nil {
		return Volume{}, err
	}
	return Volume{Name: name, Path: e.volumeData(name), UsedBy: users[name], Created: rec.Created}, nil
}

// ListVolumes returns every named volume, by name.
func (e *Engine) ListVolumes(ctx context.Context) ([]Volume, error) {
	ents, err := os.ReadDir(e.volumesDir())
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, nil
		}
		return nil, err
	}
	users, err := e.volumeUsers()
	if err != nil {
		return nil, err
	}
	var out []Volume
	for _, ent := range ents {
		if !ent.IsDir() || policy.CheckVolumeName(ent.Name()) != nil {
			continue
		}
		v, err := e.loadVolume(ent.Name(), users)
		if err != nil {
			if errors.Is(err, errdefs.ErrNotFound) {
				continue // being created or removed right now
			}
			return nil, err
		}
		out = append(out, v)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// RemoveVolume removes the named volume and its files. A volume that a
// sandbox mounts (running, paused or stopped) is refused unless force;
// with force, those sandboxes keep what they have open, and a paused or
// stopped one cannot start again.
func (e *Engine) RemoveVolume(ctx context.Context, name string, force bool) error {
	if err := policy.CheckVolumeName(name); err != nil {
		return err
	}
	unlock, err := e.lockVolumes(unix.LOCK_EX)
	if err != nil {
		return err
	}
	defer unlock()
	users, err := e.volumeUsers()
	if err != nil {
		return err
	}
	if _, err := e.loadVolume(name, users); err != nil {
		return err
	}
	if u := users[name]; len(u) > 0 && !force {
		short := make([]string, len(u))
		for i, id := range u {
			short[i] = shortID(id)
		}
		return fmt.Errorf("volume %q is in use by sandbox %s (remove them first, or force): %w", name, strings.Join(short, ", "), errdefs.ErrFailedPrecondition)
	}
	// Rename first, so that a half-removed volume is never found.
	tmp := filepath.Join(e.volumesDir(), ".rm-"+name)
	if err := os.Rename(e.volumeDir(name), tmp); err != nil {
		return err
	}
	return os.RemoveAll(tmp)
}

// volumeUsers maps each volume name to the sandboxes whose bundle mounts
// it. The bundle is the truth: it is what runsc starts, resumes and forks.
func (e *Engine) volumeUsers() (map[string][]string, error) {
	ents, err := os.ReadDir(e.sandboxesDir())
	if err != nil {
		return nil, err
	}
	prefix := e.volumesDir() + "/"
	users := map[string][]string{}
	for _, ent := range ents {
		if !ent.IsDir() {
			continue
		}
		spec, err := readSpec(filepath.Join(e.sandboxDir(ent.Name()), "bundle"))
		if err != nil {
			continue // no bundle yet (creates hold the volumes lock) or gone
		}
		seen := map[string]bool{}
		for _, m := range spec.Mounts {
			if m.Type != "bind" || !strings.HasPrefix(m.Source, prefix) {
				continue
			}
			name, _, _ := strings.Cut(strings.TrimPrefix(m.Source, prefix), "/")
			if !seen[name] {
				seen[name] = true
				users[name] = append(users[name], ent.Name())
			}
		}
	}
	return users, nil
}

// resolveMounts checks ms and renders them as spec mounts: host sources
// resolved (symlinks followed, now and only now), named volumes found.
func (e *Engine) resolveMounts(ms []Mount) ([]specs.Mount, error) {
	if len(ms) == 0 {
		return nil, nil
	}
	root, err := filepath.EvalSymlinks(e.opts.Root)
	if err != nil {
		return nil, err
	}
	var out []specs.Mount
	targets := map[string]bool{}
	for _, m := range ms {
		if err := policy.CheckMountTarget(m.Target); err != nil {
			return nil, err
		}
		if targets[m.Target] {
			return nil, fmt.Errorf("mount target %s: given twice: %w", m.Target, errdefs.ErrInvalidArgument)
		}
		targets[m.Target] = true
		var src string
		switch {
		case m.Source != "" && m.Volume != "":
			return nil, fmt.Errorf("mount at %s: both a host directory and a volume: %w", m.Target, errdefs.ErrInvalidArgument)
		case m.Overlay && m.Source == "":
			return nil, fmt.Errorf("mount at %s: an overlay workspace needs a host directory: %w", m.Target, errdefs.ErrInvalidArgument)
		case m.Overlay && m.ReadOnly:
			return nil, fmt.Errorf("mount at %s: an overlay workspace cannot be read-only: %w", m.Target, errdefs.ErrInvalidArgument)
		case m.Volume != "":
			if err := policy.CheckVolumeName(m.Volume); err != nil {
				return nil, err
			}
			if _, err := e.loadVolume(m.Volume, nil); err != nil {
				return nil, err
			}
			src = e.volumeData(m.Volume)
		case m.Source != "":
			// An overlay never writes its host directory: reading is enough.
			if src, err = resolveHostSource(m.Source, root, m.ReadOnly || m.Overlay, e.rootless); err != nil {
				return nil, err
			}
		default:
			return nil, fmt.Errorf("mount at %s: no host directory or volume: %w", m.Target, errdefs.ErrInvalidArgument)
		}
		mode := "rw"
		if m.ReadOnly {
			mode = "ro"
		}
		opts := []string{"rbind", mode, "nosuid", "nodev", runsc.MountNoSetID}
		if m.Volume == "" {
			opts = append(opts, runsc.MountOwnerFromParent)
		}
		out = append(out, specs.Mount{
			Destination: m.Target, Type: "bind", Source: src, Options: opts,
		})
	}
	return out, nil
}

// resolveHostSource resolves a host directory to mount, refusing what
// policy.CheckHostSource refuses and, rootless, what the user could not
// read (or write, for a read-write mount) themselves.
func resolveHostSource(p, root string, ro, rootless bool) (string, error) {
	if !filepath.IsAbs(p) {
		return "", fmt.Errorf("host directory %q: not an absolute path: %w", p, errdefs.ErrInvalidArgument)
	}
	res, err := filepath.EvalSymlinks(p)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return "", fmt.Errorf("host directory %s: does not exist: %w", p, errdefs.ErrNotFound)
		}
		return "", fmt.Errorf("host directory %s: %w: %w", p, errdefs.ErrInvalidArgument, err)
	}
	fi, err := os.Stat(res)
	if err != nil {
		return "", fmt.Errorf("host directory %s: %w: %w", p, errdefs.ErrInvalidArgument, err)
	}
	if !fi.IsDir() {
		return "", fmt.Errorf("host directory %s: not a directory: %w", p, errdefs.ErrInvalidArgument)
	}
	if err := policy.CheckHostSource(res, root); err != nil {
		return "", err
	}
	if rootless {
		need := uint32(unix.R_OK | unix.X_OK)
		if !ro {
			need |= unix.W_OK
		}
		if err := unix.Access(res, need); err != nil {
			what := "read"
			if !ro {
				what = "read and write"
			}
			return "", fmt.Errorf("host directory %s: you cannot %s it: %w", p, what, errdefs.ErrPermissionDenied)
		}
	}
	return res, nil
}

// checkVolumesPresent refuses, naming it, a named volume that sandbox id's
// bundle mounts and that was removed (`volume rm -f`): runsc would fail
// to restore or start the sandbox with a low-level error.
func (e *Engine) checkVolumesPresent(id string) error {
	spec, err := readSpec(filepath.Join(e.sandboxDir(id), "bundle"))
	if err != nil {
		return err
	}
	prefix := e.volumesDir() + "/"
	for _, m := range spec.Mounts {
		rest, ok := strings.CutPrefix(m.Source, prefix)
		if m.Type != "bind" || !ok {
			continue
		}
		if _, err := os.Stat(m.Source); errors.Is(err, os.ErrNotExist) {
			name, _, _ := strings.Cut(rest, "/")
			return fmt.Errorf("volume %q (mounted at %s) was removed; create it again (`hutch volume create %s`) to resume with an empty volume: %w", name, m.Destination, name, errdefs.ErrFailedPrecondition)
		}
	}
	return nil
}
