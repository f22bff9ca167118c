package engine

import (
	"context"
	"errors"
	"fmt"

	"github.com/containerd/errdefs"
	"github.com/moby/buildkit/client"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"hutch.dev/hutch/overlay"
	"hutch.dev/hutch/registry"
)

// PullPolicy says when a create fetches its image from a registry.
type PullPolicy string

// Pull policies, as docker's --pull.
const (
	// PullNever uses the store only (the zero value: creates reach no
	// registry unless asked to).
	PullNever PullPolicy = "never"
	// PullMissing pulls when the store has no image of that name.
	PullMissing PullPolicy = "missing"
	// PullAlways pulls before every create, so a moved tag is followed.
	PullAlways PullPolicy = "always"
)

// ParsePullPolicy reads "missing", "always" or "never" ("" is never).
func ParsePullPolicy(s string) (PullPolicy, error) {
	switch p := PullPolicy(s); p {
	case "":
		return PullNever, nil
	case PullNever, PullMissing, PullAlways:
		return p, nil
	}
	return "", fmt.Errorf("pull policy %q: want missing, always or never: %w", s, errdefs.ErrInvalidArgument)
}

// RegistryOptions say how to reach registries.
type RegistryOptions struct {
	// Insecure are registry hosts (host[:port]) reached over plain HTTP.
	Insecure []string
	// CACerts are trusted for registries' TLS certificates besides the
	// system's and the state root's (TrustDir).
	CACerts []CACert
}

// PullRequest is one image to fetch from a registry.
type PullRequest struct {
	// Ref is the image as docker users write it: "python:3.12",
	// "ghcr.io/o/r:tag", "host:port/r@sha256:...".
	Ref      string
	Registry RegistryOptions
	// Status, if set, receives progress and is closed when the pull ends.
	Status chan *client.SolveStatus
}

// PushRequest sends a stored image to a registry.
type PushRequest struct {
	// Image names the image in the store; Ref where it goes.
	Image, Ref string
	Registry   RegistryOptions
	// Status, if set, receives progress and is closed when the push ends.
	Status chan *client.SolveStatus
}

// LoginRequest stores credentials for a registry after checking them.
type LoginRequest struct {
	// Registry is the host: "ghcr.io", "127.0.0.1:5000", "docker.io".
	Registry           string
	Username, Password string
	Options            RegistryOptions
}

func (e *Engine) registryOptions(o RegistryOptions) (registry.Options, error) {
	for _, h := range o.Insecure {
		if err := registry.ValidHost(h); err != nil {
			return registry.Options{}, fmt.Errorf("insecure registry: %w", err)
		}
	}
	certs, err := e.extraCAs(o.CACerts)
	if err != nil {
		return registry.Options{}, err
	}
	return registry.Options{
		Credentials: registry.NewCredentials(e.opts.Root), Insecure: o.Insecure, RootCAs: certPool(certs),
	}, nil
}

// Pull fetches req.Ref into the image store, named by its full reference
// (docker.io/library/python:3.12 for python:3.12), choosing linux on this
// machine's architecture from a multi-platform image. Every blob is
// verified; on error nothing is named. Credentials come from Login's store,
// then docker's config and credential helpers. Pulls need no root: a
// rootless engine pulls into its user's own store.
func (e *Engine) Pull(ctx context.Context, req PullRequest) (overlay.Image, error) {
	o, err := e.registryOptions(req.Registry)
	if err != nil {
		if req.Status != nil {
			close(req.Status)
		}
		return overlay.Image{}, err
	}
	return registry.Pull(ctx, e.images, req.Ref, o, req.Status)
}

// Push sends the stored image req.Image to the registry reference req.Ref.
// It returns the pushed manifest's descriptor.
func (e *Engine) Push(ctx context.Context, req PushRequest) (ocispec.Descriptor, error) {
	o, err := e.registryOptions(req.Registry)
	if err == nil {
		// The test and default images enter the store on first use.
		_, err = e.Image(ctx, req.Image)
	}
	if err != nil {
		if req.Status != nil {
			close(req.Status)
		}
		return ocispec.Descriptor{}, err
	}
	return registry.Push(ctx, e.images, req.Image, req.Ref, o, req.Status)
}

// Login checks req's credentials against the registry and stores them under
// the state root (mode 0600) for later pulls and pushes.
func (e *Engine) Login(ctx context.Context, req LoginRequest) error {
	o, err := e.registryOptions(req.Options)
	if err != nil {
		return err
	}
	return registry.Login(ctx, o, req.Registry, req.Username, req.Password)
}

// Logout forgets the stored credentials for host.
func (e *Engine) Logout(host string) error {
	return registry.Logout(registry.Options{Credentials: registry.NewCredentials(e.opts.Root)}, host)
}

// NeedsPull reports whether a create of image under policy p would pull:
// always (for a registry reference) or when the store lacks it. The
// default, test and Docker images are never pulled: they are built or
// imported.
func (e *Engine) NeedsPull(ctx context.Context, image string, p PullPolicy) (bool, error) {
	if image == "" {
		image = DefaultImage
	}
	norm, err := overlay.ParseName(image)
	if err != nil {
		return false, err
	}
	if p == "" || p == PullNever || norm == DefaultImage || norm == TestImage || norm == DockerImage {
		return false, nil
	}
	if p == PullAlways {
		return true, nil
	}
	_, err = e.images.Get(ctx, image)
	if errors.Is(err, errdefs.ErrNotFound) {
		return true, nil
	}
	return false, err
}

// pullFor pulls the image a create names if its policy says so.
func (e *Engine) pullFor(ctx context.Context, req CreateRequest) error {
	if _, err := ParsePullPolicy(string(req.Pull)); err != nil {
		return err
	}
	need, err := e.NeedsPull(ctx, req.Image, req.Pull)
	if err != nil || !need {
		return err
	}
	reg := req.Registry
	// The sandbox's extra CAs are trusted for its image too.
	reg.CACerts = append(append([]CACert{}, reg.CACerts...), req.CACerts...)
	_, err = e.Pull(ctx, PullRequest{Ref: req.Image, Registry: reg})
	return err
}
