// Package engine is hutch's Go API: what the hutch CLI does, for platforms that
// embed hutch instead of shelling out to it.
//
// It orchestrates the other packages in the order of DESIGN.md: policy
// validates and renders a request, overlay provides the image's rootfs,
// runsc runs it. Its state lives in files under one root directory;
// there is no daemon, so every Engine method works from a fresh process and
// many processes may use one root at once.
//
// It parses no flags and prints nothing for humans.
package engine

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/containerd/errdefs"

	"hutch.dev/hutch/assembly"
	"hutch.dev/hutch/buildimg"
	"hutch.dev/hutch/overlay"
	"hutch.dev/hutch/runsc"
)

// DefaultImage is the image a sandbox gets when the request names none:
// Debian with Python, Node and git, built on first use (BuildBase).
const DefaultImage = buildimg.BaseImage

// TestImage is a small busybox image imported from an archive beside hutch
// the first time it is asked for.
const TestImage = "busybox:latest"

// Options configure an Engine.
type Options struct {
	// Root is the state directory; empty means DefaultRoot().
	Root string
	// NoDocker refuses Docker sandboxes (CreateRequest.Docker, or an
	// image labelled LabelDocker): what they are given (docs/security.md)
	// is then given to none. `hutch serve --no-docker` sets it.
	NoDocker bool
	// RunscPath is the runsc binary; empty means FindRunsc().
	RunscPath string
	// InitPath is the hutch-init binary mounted into every sandbox as its
	// init; empty means "hutch-init" beside the running executable.
	InitPath string
	// DefaultImageArchive is an OCI archive imported as TestImage the
	// first time a sandbox needs it; empty means images/busybox.tar beside
	// the running executable.
	DefaultImageArchive string
	// BaseRootfsArchive, if the file exists, is imported as the Debian
	// root filesystem of the default image instead of running mmdebstrap;
	// empty means images/bookworm-rootfs.tar beside the running executable.
	BaseRootfsArchive string
	// BuildkitAddr is an existing buildkitd to build with; empty: hutch runs
	// its own under <Root>/buildkit, started on demand.
	BuildkitAddr string
	// BuildkitIdle is how long hutch's own buildkitd outlives its last build;
	// 0 means buildimg.DefaultIdle.
	BuildkitIdle time.Duration
	// Platform is gVisor's platform; empty means runsc's default.
	Platform string
	// DebugLog, if set, is a directory for runsc's debug logs.
	DebugLog string
	// HutchPath is the hutch binary, which runs a sandbox's detached helper
	// processes (its DNS resolver, its port forwarder); empty means the
	// running executable. Programs that embed the engine set it to a hutch
	// binary.
	HutchPath string
	// WatchdogCommand, with a sandbox ID appended, runs RunWatchdog for
	// that sandbox in a new process (the hutch CLI's hidden watchdog
	// command). Without it, creates with a Timeout are refused.
	WatchdogCommand []string
	// SharedImages is the shared image store, looked in for an image this
	// root lacks (ShareImage fills it); empty means $HUTCH_SHARED_IMAGES if
	// set (set and empty: none), else DefaultSharedImages.
	SharedImages string
}

// Engine creates and drives sandboxes under one state root.
type Engine struct {
	opts     Options
	images   *overlay.Store
	rootless bool
}

// DefaultRoot is the state root for the current user: $HUTCH_ROOT if set,
// /var/lib/hutch for root, else $XDG_DATA_HOME/hutch or ~/.local/share/hutch.
func DefaultRoot() string {
	if r := os.Getenv("HUTCH_ROOT"); r != "" {
		return r
	}
	if os.Geteuid() == 0 {
		return "/var/lib/hutch"
	}
	if x := os.Getenv("XDG_DATA_HOME"); x != "" {
		return filepath.Join(x, "hutch")
	}
	home, err := os.UserHomeDir()
	if err != nil {
		home = "/tmp/hutch-" + strconv.Itoa(os.Getuid())
	}
	return filepath.Join(home, ".local", "share", "hutch")
}

// exeDir is the directory of the running executable.
func exeDir() string {
	exe, err := os.Executable()
	if err != nil {
		return ""
	}
	if r, err := filepath.EvalSymlinks(exe); err == nil {
		exe = r
	}
	return filepath.Dir(exe)
}

// FindRunsc locates runsc: $HUTCH_RUNSC, then "runsc" beside the running
// executable, then $PATH.
func FindRunsc() (string, error) { return assembly.FindRunsc() }

// Open opens (creating if needed) the state root described by o.
func Open(o Options) (*Engine, error) {
	if o.Root == "" {
		o.Root = DefaultRoot()
	}
	root, err := filepath.Abs(o.Root)
	if err != nil {
		return nil, err
	}
	o.Root = root
	if err := CheckFormerState(root); err != nil {
		return nil, err
	}
	if o.RunscPath == "" {
		if o.RunscPath, err = FindRunsc(); err != nil {
			return nil, err
		}
	} else if o.RunscPath, err = assembly.CheckRunsc(o.RunscPath); err != nil {
		return nil, err
	}
	if o.HutchPath == "" {
		if o.HutchPath, err = os.Executable(); err != nil {
			return nil, err
		}
	}
	if o.InitPath == "" {
		o.InitPath = filepath.Join(exeDir(), "hutch-init")
	}
	if o.DefaultImageArchive == "" {
		o.DefaultImageArchive = filepath.Join(exeDir(), "images", "busybox.tar")
	}
	if o.BaseRootfsArchive == "" {
		o.BaseRootfsArchive = filepath.Join(exeDir(), "images", "bookworm-rootfs.tar")
	}
	if err := makeStateDirs(o.Root, filepath.Join(o.Root, "sandboxes"), filepath.Join(o.Root, "runsc")); err != nil {
		return nil, err
	}
	images, err := overlay.Open(filepath.Join(o.Root, "images"))
	if err != nil {
		return nil, err
	}
	return &Engine{opts: o, images: images, rootless: os.Geteuid() != 0}, nil
}

// Root is the engine's state directory.
func (e *Engine) Root() string { return e.opts.Root }

// RunscPath is the runsc binary the engine drives.
func (e *Engine) RunscPath() string { return e.opts.RunscPath }

// Rootless reports whether the engine runs sandboxes as an unprivileged user.
func (e *Engine) Rootless() bool { return e.rootless }

// Images is the engine's image store.
func (e *Engine) Images() *overlay.Store { return e.images }

// Image returns the named image. The first time it is asked for, the
// default image is built (BuildBase, with no progress shown) and the test
// image imported from its archive.
func (e *Engine) Image(ctx context.Context, name string) (overlay.Image, error) {
	norm, err := overlay.ParseName(name)
	if err != nil {
		return overlay.Image{}, err
	}
	img, err := e.images.Get(ctx, norm)
	if err == nil || !errors.Is(err, errdefs.ErrNotFound) {
		return img, err
	}
	if shared, serr := e.fromShared(ctx, norm); !errors.Is(serr, errdefs.ErrNotFound) {
		return shared, serr
	}
	if norm == DefaultImage {
		return e.BuildBase(ctx, BaseRequest{})
	}
	if norm == DockerImage {
		return img, fmt.Errorf("%w (build it with `make docker-image`, then `hutch image import %s bin/images/docker.tar`)", err, DockerImage)
	}
	if norm != TestImage {
		return img, err
	}
	f, ferr := os.Open(e.opts.DefaultImageArchive)
	if ferr != nil {
		return img, fmt.Errorf("%w (and its archive %s is missing: run `make`)", err, e.opts.DefaultImageArchive)
	}
	defer f.Close()
	return e.images.Import(ctx, norm, f)
}

// Version is the runsc version the engine drives.
func (e *Engine) Version(ctx context.Context) (string, error) {
	r := &runsc.Runsc{Path: e.opts.RunscPath}
	return r.Version(ctx)
}

// RunscVersion is the first line of `runsc --version` of the runsc at
// path (FindRunsc's when empty), and that runsc's absolute path. It opens
// no state root.
func RunscVersion(ctx context.Context, path string) (version, abs string, err error) {
	if path == "" {
		abs, err = FindRunsc()
	} else {
		abs, err = assembly.CheckRunsc(path)
	}
	if err != nil {
		return "", "", err
	}
	version, err = (&runsc.Runsc{Path: abs}).Version(ctx)
	return version, abs, err
}

// sandboxesDir is where sandbox records live.
func (e *Engine) sandboxesDir() string { return filepath.Join(e.opts.Root, "sandboxes") }

func (e *Engine) sandboxDir(id string) string { return filepath.Join(e.sandboxesDir(), id) }

// runscFor is the runsc wrapper for sandbox sb: the same global flags for
// every call on it.
func (e *Engine) runscFor(sb *record) *runsc.Runsc {
	r := assembly.Runsc(assembly.RunscConfig{
		Path:          e.opts.RunscPath,
		Root:          filepath.Join(e.opts.Root, "runsc"),
		Platform:      e.opts.Platform,
		DebugLogDir:   e.opts.DebugLog,
		Linked:        sb.Linked,
		OverlayDir:    e.sandboxDir(sb.ID),
		Disk:          sb.Disk,
		IgnoreCgroups: sb.Rootless && sb.Cgroup == "",
		// sudo works in the default image, as in E2B's; root there is
		// still inside gVisor (docs/security.md).
		AllowSUID: true,
		NetRaw:    sb.Docker,
	})
	if sb.Rootless {
		// As root of the user namespace that owns its network namespace
		// and its overlay workspaces' mounts, if it has them.
		r.Wrapper = assembly.RootlessRunsc(e.sandboxDir(sb.ID))
	}
	return r
}

// cgroupPath is the cgroup runsc puts sandbox id in (root only).
func cgroupPath(id string) string { return "/hutch/" + id }

// shortID is the ID as lists show it.
func shortID(id string) string {
	if len(id) > 12 {
		return id[:12]
	}
	return id
}

func quote(s string) string { return strconv.Quote(strings.TrimSpace(s)) }
