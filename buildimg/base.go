package buildimg

import (
	"context"
	_ "embed"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/containerd/errdefs"
	"github.com/moby/buildkit/client"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"golang.org/x/sys/unix"

	"hutch.dev/hutch/overlay"
)

// The default image and the Debian root filesystem it is built on.
const (
	BaseImage   = "base:latest"
	RootfsImage = "bookworm-rootfs:latest"
	// Suite is the Debian release of both.
	Suite = "bookworm"
)

// BaseDockerfile is buildimg/base/Dockerfile: the layers BuildKit adds on
// top of RootfsImage to make BaseImage.
//
//go:embed base/Dockerfile
var BaseDockerfile []byte

// BasePackages are the Debian packages mmdebstrap installs into
// RootfsImage, with their dependencies.
var BasePackages = []string{
	"bash", "coreutils", "procps", "python3", "python3-pip", "python3-venv",
	"nodejs", "npm", "git", "curl", "ca-certificates", "build-essential",
	"less", "nano", "xz-utils", "unzip", "sudo", "rsync",
}

// BaseOptions describe how BuildBase makes the base image.
type BaseOptions struct {
	// WorkDir holds temporary files (the mmdebstrap tarball, the build
	// context) and the lock that serialises base builds.
	WorkDir string
	// RootfsArchive, if it names an existing OCI archive, is imported as
	// RootfsImage instead of running mmdebstrap (`make` writes one).
	RootfsArchive string
	// Log receives mmdebstrap's output and one line per stage.
	Log io.Writer
	// Status receives BuildKit's progress; BuildBase closes it.
	Status chan *client.SolveStatus
}

// BuildBase makes BaseImage in b's store: RootfsImage first if it is
// missing (from o.RootfsArchive, else with mmdebstrap from Debian's
// packages), then BaseDockerfile on top with BuildKit. Concurrent calls on
// one WorkDir build once; later ones find the image.
func (b *Builder) BuildBase(ctx context.Context, o BaseOptions) (img overlay.Image, err error) {
	status := o.Status
	defer func() {
		if status != nil {
			close(status)
		}
	}()
	logw := o.Log
	if logw == nil {
		logw = io.Discard
	}
	if err := os.MkdirAll(o.WorkDir, 0o700); err != nil {
		return img, err
	}
	l, err := flock(filepath.Join(o.WorkDir, "base.lock"), unix.LOCK_EX)
	if err != nil {
		return img, err
	}
	defer l.Close()
	if img, err := b.Store.Get(ctx, BaseImage); err == nil {
		return img, nil
	}
	if _, err := b.Store.Get(ctx, RootfsImage); errdefs.IsNotFound(err) {
		if err := b.rootfs(ctx, o, logw); err != nil {
			return img, err
		}
	} else if err != nil {
		return img, err
	}
	dir, err := os.MkdirTemp(o.WorkDir, "base-context-")
	if err != nil {
		return img, err
	}
	defer os.RemoveAll(dir)
	if err := os.WriteFile(filepath.Join(dir, "Dockerfile"), BaseDockerfile, 0o644); err != nil {
		return img, err
	}
	fmt.Fprintf(logw, "building %s from %s with BuildKit\n", BaseImage, RootfsImage)
	status = nil // Build closes it
	return b.Build(ctx, Options{ContextDir: dir, Tag: BaseImage, Status: o.Status})
}

// rootfs makes RootfsImage from the archive or with mmdebstrap.
func (b *Builder) rootfs(ctx context.Context, o BaseOptions, logw io.Writer) error {
	if o.RootfsArchive != "" {
		if f, err := os.Open(o.RootfsArchive); err == nil {
			defer f.Close()
			fmt.Fprintf(logw, "importing %s from %s\n", RootfsImage, o.RootfsArchive)
			_, err := b.Store.Import(ctx, RootfsImage, f)
			return err
		}
	}
	fmt.Fprintf(logw, "installing Debian %s from Debian's packages with mmdebstrap (a few minutes)\n", Suite)
	_, err := Bootstrap(ctx, b.Store, RootfsImage, o.WorkDir, logw)
	return err
}

// Bootstrap installs Debian Suite with BasePackages with mmdebstrap and
// stores it as the one-layer image name. As root mmdebstrap runs in its
// root mode; without root in its unshare mode, in a user namespace mapped
// to the user's subordinate IDs (RootlessMissing says what that needs). mmdebstrap's output goes
// to logw. Temporary files go under workDir and are removed.
func Bootstrap(ctx context.Context, store *overlay.Store, name, workDir string, logw io.Writer) (overlay.Image, error) {
	mm, err := exec.LookPath("mmdebstrap")
	if err != nil {
		return overlay.Image{}, fmt.Errorf("mmdebstrap not found (apt-get install mmdebstrap, or `make deps`): %w", errdefs.ErrNotFound)
	}
	mode := "--mode=root"
	if os.Geteuid() != 0 {
		if err := checkRootless(); err != nil {
			return overlay.Image{}, fmt.Errorf("making the Debian root filesystem: %w", err)
		}
		mode = "--mode=unshare"
	}
	if err := os.MkdirAll(workDir, 0o700); err != nil {
		return overlay.Image{}, err
	}
	tmp, err := os.MkdirTemp(workDir, "mmdebstrap-")
	if err != nil {
		return overlay.Image{}, err
	}
	defer os.RemoveAll(tmp)
	out := filepath.Join(tmp, "rootfs.tar")
	chroots := tmp
	if mode == "--mode=unshare" {
		// The chroot belongs to the first subordinate ID, which must
		// reach it: not under the user's own 0700 directories.
		if chroots, err = os.MkdirTemp(unshareTmp(), "hutch-mmdebstrap-"); err != nil {
			return overlay.Image{}, err
		}
		defer os.RemoveAll(chroots)
		if err := os.Chmod(chroots, 0o711); err != nil {
			return overlay.Image{}, err
		}
	}
	args := []string{
		mode, "--variant=apt", "--format=tar",
		"--include=" + strings.Join(BasePackages, ","),
		"--dpkgopt=path-exclude=/usr/share/man/*",
		"--dpkgopt=path-exclude=/usr/share/doc/*",
		"--dpkgopt=path-include=/usr/share/doc/*/copyright",
		"--aptopt=Acquire::Retries \"3\"",
		Suite, out,
	}
	cmd := exec.CommandContext(ctx, mm, args...)
	cmd.Stdout, cmd.Stderr = logw, logw
	cmd.Env = append(os.Environ(), "TMPDIR="+chroots, "DEBIAN_FRONTEND=noninteractive")
	if err := cmd.Run(); err != nil {
		if ctx.Err() != nil {
			return overlay.Image{}, fmt.Errorf("mmdebstrap interrupted: %w", ctx.Err())
		}
		return overlay.Image{}, fmt.Errorf("mmdebstrap %s: %w", Suite, err)
	}
	f, err := os.Open(out)
	if err != nil {
		return overlay.Image{}, err
	}
	defer f.Close()
	return store.Commit(ctx, overlay.CommitOptions{
		Name:  name,
		Layer: f,
		Config: &ocispec.ImageConfig{
			Env: []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"},
			Cmd: []string{"/bin/bash"},
		},
		History: "mmdebstrap --variant=apt " + Suite + " " + strings.Join(BasePackages, " "),
	})
}

// unshareTmp is where mmdebstrap's unshare mode makes its chroot: on disk
// (/var/tmp) where there is one, for a chroot of several hundred MB.
func unshareTmp() string {
	if fi, err := os.Stat("/var/tmp"); err == nil && fi.IsDir() && fi.Mode()&os.ModeSticky != 0 && fi.Mode()&0o002 != 0 {
		return "/var/tmp"
	}
	return "/tmp"
}
