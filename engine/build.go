package engine

import (
	"context"
	"errors"
	"fmt"
	"io"
	"path/filepath"

	"github.com/containerd/errdefs"
	"github.com/moby/buildkit/client"

	"hutch.dev/hutch/buildimg"
	"hutch.dev/hutch/overlay"
)

// BuildRequest is one Dockerfile build into the engine's image store.
type BuildRequest struct {
	// ContextDir is the build context directory.
	ContextDir string
	// Dockerfile is the Dockerfile's path; empty: ContextDir/Dockerfile.
	Dockerfile string
	// Tag names the resulting image; empty keeps the result only in
	// BuildKit's cache.
	Tag string
	// BuildArgs set the Dockerfile's ARGs.
	BuildArgs map[string]string
	// Labels are set on the image, over the Dockerfile's LABELs (e.g.
	// LabelStart and LabelReady, which make it a template).
	Labels map[string]string
	// Status, if set, receives BuildKit's progress and is closed when the
	// build ends.
	Status chan *client.SolveStatus
	// Allow is the build allow list (policy.ParseAllow rules): with any,
	// every RUN step gets a network of its own that reaches only what
	// the rules name, as a sandbox's --net allow, and trusts the host's
	// CA certificates. Without, steps have no network. Root only.
	Allow []string
	// DNS are the upstream servers the steps' resolvers ask; none: the
	// host's. Only with Allow.
	DNS []string
}

// BaseRequest is a build of the default image.
type BaseRequest struct {
	// Log receives a line per stage and mmdebstrap's output.
	Log io.Writer
	// Status, if set, receives BuildKit's progress and is closed when the
	// build ends.
	Status chan *client.SolveStatus
}

// builder is the engine's BuildKit client: Options.BuildkitAddr, or the
// buildkitd hutch runs under <root>/buildkit.
func (e *Engine) builder() *buildimg.Builder {
	dir := exeDir()
	return &buildimg.Builder{
		Store: e.images,
		Addr:  e.opts.BuildkitAddr,
		Daemon: &buildimg.Daemon{
			Dir:        filepath.Join(e.opts.Root, "buildkit"),
			Buildkitd:  filepath.Join(dir, "buildkitd"),
			Supervisor: filepath.Join(dir, "hutch-buildkitd"),
			Runtime:    filepath.Join(dir, "hutch-buildkit-runtime"),
			Runsc:      e.opts.RunscPath,
			Platform:   e.opts.Platform,
			Idle:       e.opts.BuildkitIdle,
		},
	}
}

// Build builds a Dockerfile with BuildKit; every RUN step runs under
// gVisor. FROM names images as --image does (Image): the engine's store,
// then the shared one; the default image is built first if missing. Bad
// input fails before any build starts; on any error nothing is tagged.
// With req.Allow, the build runs on the daemon of that allow list
// (netBuilder).
func (e *Engine) Build(ctx context.Context, req BuildRequest) (overlay.Image, error) {
	b := e.builder()
	if len(req.Allow) > 0 || len(req.DNS) > 0 {
		var err error
		if b, err = e.netBuilder(req.Allow, req.DNS); err != nil {
			if req.Status != nil {
				close(req.Status)
			}
			return overlay.Image{}, err
		}
	}
	return b.Build(ctx, buildimg.Options{
		ContextDir: req.ContextDir, Dockerfile: req.Dockerfile, Tag: req.Tag,
		BuildArgs: req.BuildArgs, Labels: req.Labels, Status: req.Status, Image: e.Image,
	})
}

// BuildBase builds the default image (buildimg.BaseImage) if the store
// lacks it, and returns it. Without root it first copies it from the
// shared image store if root published it there; else it builds it as
// root does, in the user's namespaces (docs/decisions/0027), if the host
// allows (buildimg.RootlessMissing).
func (e *Engine) BuildBase(ctx context.Context, req BaseRequest) (overlay.Image, error) {
	if e.rootless {
		img, err := e.fromShared(ctx, DefaultImage)
		if !errors.Is(err, errdefs.ErrNotFound) {
			if req.Status != nil {
				close(req.Status)
			}
			return img, err
		}
		if err := e.BuilderCheck(); err != nil {
			if req.Status != nil {
				close(req.Status)
			}
			shared := "there is no shared image store"
			if dir := e.SharedImages(); dir != "" {
				shared = "the shared image store " + dir + " lacks it"
			}
			return overlay.Image{}, fmt.Errorf("the default image %s is not in this store, %s, and it cannot be built here (%w); ask root to run `hutch image share %s`, import one (hutch image import base FILE.tar) or use --image busybox",
				DefaultImage, shared, err, DefaultImage)
		}
	}
	img, err := e.builder().BuildBase(ctx, buildimg.BaseOptions{
		WorkDir:       filepath.Join(e.opts.Root, "buildkit"),
		RootfsArchive: e.opts.BaseRootfsArchive,
		Log:           req.Log,
		Status:        req.Status,
	})
	if err != nil {
		return img, fmt.Errorf("building the default image %s: %w", DefaultImage, err)
	}
	return img, nil
}

// DefaultImageNeed is what a create needs done about the default image
// before it can start.
type DefaultImageNeed int

const (
	// DefaultImageReady: the create names another image, or the store
	// holds the default one.
	DefaultImageReady DefaultImageNeed = iota
	// DefaultImageQuick: BuildBase takes it from the shared store, or
	// refuses at once with what is missing; no build to show.
	DefaultImageQuick
	// DefaultImageBuild: BuildBase builds it, which takes minutes; the
	// caller should say so and show the build's progress.
	DefaultImageBuild
)

// NeedDefaultImage tells what a create of req needs done about the default
// image, after checking req itself (ValidateCreate), so that a bad
// request fails before any build.
func (e *Engine) NeedDefaultImage(ctx context.Context, req CreateRequest) (DefaultImageNeed, error) {
	if req.image() != DefaultImage {
		return DefaultImageReady, nil
	}
	if err := e.ValidateCreate(req); err != nil {
		return DefaultImageReady, err
	}
	if _, err := e.Images().Get(ctx, DefaultImage); err == nil {
		return DefaultImageReady, nil
	}
	if e.rootless {
		if s, err := e.SharedStore(); err == nil {
			if _, err := s.Get(ctx, DefaultImage); err == nil {
				return DefaultImageQuick, nil
			}
		}
		if e.BuilderCheck() != nil {
			return DefaultImageQuick, nil
		}
	}
	return DefaultImageBuild, nil
}

// StopBuilder stops the buildkitds hutch runs for this root, if they run:
// the one without network and those of build allow lists.
func (e *Engine) StopBuilder(ctx context.Context) error {
	err := e.builder().Daemon.Stop(ctx)
	for _, d := range e.netDaemonDirs() {
		b := e.builder()
		b.Daemon.Dir = d
		err = errors.Join(err, b.Daemon.Stop(ctx))
	}
	return err
}

// BuilderCheck says what is missing for this engine to build images (and
// the default image) itself: nil when it can, or when it builds with an
// existing buildkitd (Options.BuildkitAddr). Without root that is the
// builder's binaries, newuidmap and newgidmap, and the user's subordinate
// IDs (docs/decisions/0027-rootless-builds.md).
func (e *Engine) BuilderCheck() error {
	b := e.builder()
	if b.Addr != "" {
		return nil
	}
	return b.Daemon.Check()
}
