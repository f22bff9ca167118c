// Package workspace holds a sandbox's :overlay workspaces, and the diff
// and apply of their changes (hutch diff).
//
// An :overlay mount is a workspace: a host overlayfs whose lower layer is
// the host directory and whose upper and work directories are the
// sandbox's own, under <sandbox>/workspaces/N
// (docs/decisions/0016-overlay-workspaces.md). The merged directory is
// what the sandbox's spec bind-mounts. The host directory is never
// written, except by Apply.
package workspace

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"hutch.dev/hutch/assembly"
)

// Workspace is one :overlay mount of a sandbox.
type Workspace struct {
	// Source is the host directory (the lower layer), resolved at create.
	Source string `json:"source"`
	// Target is where the sandbox sees it.
	Target  string    `json:"target"`
	Created time.Time `json:"created"`
	// Rootless: the overlayfs is mounted in the sandbox's own user
	// namespace (assembly.MountRootlessOverlay) and keeps its extended
	// attributes in user.overlay.* rather than trusted.overlay.*.
	Rootless bool `json:"rootless,omitempty"`

	// sandbox is the sandbox's directory, dir the workspace's in it.
	sandbox, dir string
}

func (w *Workspace) upper() string { return filepath.Join(w.dir, "upper") }
func (w *Workspace) work() string  { return filepath.Join(w.dir, "work") }

// Merged is the overlayfs's mount point: what the sandbox's spec
// bind-mounts.
func (w *Workspace) Merged() string { return filepath.Join(w.dir, "merged") }

// opaqueXattr is the extended attribute that marks a directory of w's
// upper layer opaque. Only overlayfs can set it: it refuses its own
// namespace to writes through the mount, while the other one is any
// user's (a sandbox could set user.overlay.opaque on a root-mounted
// workspace, and must not hide the host's files from a diff with it).
func (w *Workspace) opaqueXattr() string {
	if w.Rootless {
		return "user.overlay.opaque"
	}
	return "trusted.overlay.opaque"
}

// dirOf is the directory of workspace n of the sandbox whose directory
// is sandbox.
func dirOf(sandbox string, n int) string {
	return filepath.Join(sandbox, "workspaces", strconv.Itoa(n))
}

// Create makes workspace n of the sandbox whose directory is sandbox, over
// host directory source, seen at target: its layers' directories, the
// upper one with source's owner and mode, and its workspace.json. Mount
// mounts it.
func Create(sandbox string, n int, source, target string, rootless bool) (*Workspace, error) {
	w := &Workspace{Source: source, Target: target, Created: time.Now().UTC(), Rootless: rootless,
		sandbox: sandbox, dir: dirOf(sandbox, n)}
	if err := os.MkdirAll(w.dir, 0o700); err != nil {
		return nil, err
	}
	for _, d := range []string{w.upper(), w.work(), w.Merged()} {
		if err := os.Mkdir(d, 0o700); err != nil {
			return nil, err
		}
	}
	// The merged root takes the upper root's owner and mode: make
	// them the host directory's.
	var st unix.Stat_t
	if err := unix.Stat(w.Source, &st); err != nil {
		return nil, fmt.Errorf("host directory %s: %w", w.Source, err)
	}
	if !w.Rootless {
		// Rootless, the user's own: others' are unmapped in the
		// sandbox's user namespace anyway.
		if err := os.Chown(w.upper(), int(st.Uid), int(st.Gid)); err != nil {
			return nil, err
		}
	}
	// Not subject to the umask.
	if err := unix.Chmod(w.upper(), st.Mode&0o7777); err != nil {
		return nil, err
	}
	if err := w.save(); err != nil {
		return nil, err
	}
	return w, nil
}

// save writes w's workspace.json.
func (w *Workspace) save() error {
	b, err := json.Marshal(w)
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(w.dir, "workspace.json"), b, 0o600)
}

// List reads the workspaces of the sandbox whose directory is sandbox, in
// mount order.
func List(sandbox string) ([]*Workspace, error) {
	var out []*Workspace
	for n := 0; ; n++ {
		dir := dirOf(sandbox, n)
		b, err := os.ReadFile(filepath.Join(dir, "workspace.json"))
		if errors.Is(err, os.ErrNotExist) {
			return out, nil
		}
		if err != nil {
			return nil, err
		}
		w := &Workspace{sandbox: sandbox, dir: dir}
		if err := json.Unmarshal(b, w); err != nil {
			return nil, fmt.Errorf("workspace %s: %w", dir, err)
		}
		out = append(out, w)
	}
}

// MountAll mounts the workspaces of the sandbox whose directory is
// sandbox again (before a restore: resume or fork). One already mounted is
// mounted afresh.
func MountAll(sandbox string) error {
	ws, err := List(sandbox)
	if err != nil {
		return err
	}
	for _, w := range ws {
		if !w.Rootless {
			w.unmount()
		}
		if err := w.Mount(context.Background()); err != nil {
			return fmt.Errorf("overlay workspace of %s at %s: %w", w.Source, w.Target, err)
		}
	}
	return nil
}

// UnmountAll detaches the workspace mounts of the sandbox whose directory
// is sandbox from the host; a running gofer keeps its own reference until
// it exits.
func UnmountAll(sandbox string) error {
	ws, err := List(sandbox)
	if err != nil {
		return err
	}
	var errs []error
	for _, w := range ws {
		if w.Rootless {
			// In the sandbox's mount namespace, which goes with the
			// process that holds it (and the gofer).
			errs = append(errs, assembly.StopRootlessNamespaces(sandbox))
			continue
		}
		errs = append(errs, w.unmount())
	}
	return errors.Join(errs...)
}

func (w *Workspace) unmount() error {
	for {
		err := unix.Unmount(w.Merged(), unix.MNT_DETACH)
		switch {
		case err == nil:
			continue // stacked mounts, e.g. after a crash between mounts
		case errors.Is(err, unix.EINVAL), errors.Is(err, unix.ENOENT):
			return nil
		default:
			return fmt.Errorf("unmount workspace %s: %w", w.Merged(), err)
		}
	}
}

// Mount mounts w's overlayfs. The layers are named by open file
// descriptors, so that no path (with ',' or ':' in it, or a symlink
// swapped in since create) is parsed by the kernel. redirect_dir and
// metacopy are off: every changed file is whole in the upper directory,
// and a renamed directory is copied, so the upper alone tells the changes.
// A rootless workspace is mounted in the sandbox's own user and mount
// namespaces (assembly.MountRootlessOverlay), as the user.
func (w *Workspace) Mount(ctx context.Context) error {
	if w.Rootless {
		if _, err := os.Stat(w.Source); err != nil {
			return fmt.Errorf("host directory %s: %w", w.Source, errdefs.ErrNotFound)
		}
		return assembly.MountRootlessOverlay(ctx, w.sandbox, w.Source, w.upper(), w.work(), w.Merged())
	}
	var fds []int
	defer func() {
		for _, fd := range fds {
			unix.Close(fd)
		}
	}()
	open := func(p string) (string, error) {
		fd, err := unix.Open(p, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return "", fmt.Errorf("open %s: %w", p, err)
		}
		fds = append(fds, fd)
		return "/proc/self/fd/" + strconv.Itoa(fd), nil
	}
	lower, err := open(w.Source)
	if err != nil {
		if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ELOOP) || errors.Is(err, unix.ENOTDIR) {
			return fmt.Errorf("host directory %s is gone: %w", w.Source, errdefs.ErrNotFound)
		}
		return err
	}
	upper, err := open(w.upper())
	if err != nil {
		return err
	}
	work, err := open(w.work())
	if err != nil {
		return err
	}
	data := "lowerdir=" + lower + ",upperdir=" + upper + ",workdir=" + work + ",redirect_dir=off,metacopy=off,index=off"
	if err := unix.Mount("overlay", w.Merged(), "overlay", unix.MS_NOSUID|unix.MS_NODEV, data); err != nil {
		return fmt.Errorf("mount overlayfs: %w", err)
	}
	return nil
}

// Fork gives the sandbox whose directory is sandbox a copy of each
// workspace of the one whose directory is parent (its upper layer as it is
// now: whiteouts, opaque directories, owners and modes kept) and points
// spec's mounts at the fork's merged directories. Forks never share an
// upper layer.
func Fork(ctx context.Context, spec *specs.Spec, parent, sandbox string) error {
	ws, err := List(parent)
	if err != nil || len(ws) == 0 {
		return err
	}
	for n, pw := range ws {
		w := &Workspace{Source: pw.Source, Target: pw.Target, Created: pw.Created, Rootless: pw.Rootless,
			sandbox: sandbox, dir: dirOf(sandbox, n)}
		if err := os.MkdirAll(w.dir, 0o700); err != nil {
			return err
		}
		for _, d := range []string{w.work(), w.Merged()} {
			if err := os.Mkdir(d, 0o700); err != nil {
				return err
			}
		}
		cp := exec.CommandContext(ctx, "cp", "-a", "--reflink=auto", "--", pw.upper(), w.upper())
		if out, err := cp.CombinedOutput(); err != nil {
			return fmt.Errorf("copy workspace layer of %s: %w: %s", pw.Target, err, strings.TrimSpace(string(out)))
		}
		if err := w.save(); err != nil {
			return err
		}
		for i, m := range spec.Mounts {
			if m.Type == "bind" && m.Source == pw.Merged() {
				spec.Mounts[i].Source = w.Merged()
			}
		}
	}
	return nil
}
