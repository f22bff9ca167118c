package clix

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/moby/buildkit/client"
	"github.com/moby/buildkit/util/progress/progressui"
	"github.com/urfave/cli/v2"
	"golang.org/x/term"

	"hutch.dev/hutch/engine"
)

// PullFlag is --pull on create and run.
var PullFlag = &cli.StringFlag{
	Name: "pull", Value: string(engine.PullMissing), EnvVars: []string{"HUTCH_PULL"},
	Usage: "when to fetch --image from its registry: missing (not in the store), always, or never",
}

// InsecureRegistryFlag is --insecure-registry on commands that reach
// registries.
var InsecureRegistryFlag = &cli.StringSliceFlag{
	Name: "insecure-registry", EnvVars: []string{"HUTCH_INSECURE_REGISTRY"},
	Usage: "reach registry HOST[:PORT] over plain HTTP, without TLS (registries on loopback)",
}

// CACertFlag is --ca-cert on commands that make sandboxes or reach
// registries.
var CACertFlag = &cli.StringSliceFlag{
	Name:  "ca-cert",
	Usage: "also trust the CA certificates of PEM `FILE` (repeatable): in the sandbox's trust store and for registries",
}

// CACerts reads and checks the --ca-cert files.
func CACerts(c *cli.Context) ([]engine.CACert, error) {
	var out []engine.CACert
	for _, f := range c.StringSlice(CACertFlag.Name) {
		ca, err := engine.ReadCACert(f)
		if err != nil {
			return nil, UsageError(fmt.Errorf("--ca-cert: %w", err))
		}
		out = append(out, ca)
	}
	return out, nil
}

// RegistryOptions renders --insecure-registry and --ca-cert.
func RegistryOptions(c *cli.Context) (engine.RegistryOptions, error) {
	cas, err := CACerts(c)
	return engine.RegistryOptions{Insecure: c.StringSlice(InsecureRegistryFlag.Name), CACerts: cas}, err
}

// RegistryProgress shows a pull's or push's progress on stderr when it is
// a terminal, and nothing otherwise. It returns the status channel to hand
// to the engine (nil when nothing is shown) and a function that waits for
// the display to finish.
func RegistryProgress(c *cli.Context) (chan *client.SolveStatus, func()) {
	var w io.Writer = c.App.ErrWriter
	if w == nil {
		w = os.Stderr
	}
	f, ok := w.(*os.File)
	if !ok || !term.IsTerminal(int(f.Fd())) {
		return nil, func() {}
	}
	d, err := progressui.NewDisplay(f, progressui.TtyMode)
	if err != nil {
		return nil, func() {}
	}
	ch := make(chan *client.SolveStatus)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, _ = d.UpdateFrom(context.Background(), ch)
	}()
	return ch, func() { <-done }
}

// Pull pulls ref with progress on a terminal; Ctrl-C stops it and leaves
// nothing named.
func Pull(c *cli.Context, e *engine.Engine, ref string) (engine.Image, error) {
	ctx, stop := signal.NotifyContext(c.Context, os.Interrupt, syscall.SIGTERM)
	defer stop()
	reg, err := RegistryOptions(c)
	if err != nil {
		return engine.Image{}, err
	}
	ch, wait := RegistryProgress(c)
	img, err := e.Pull(ctx, engine.PullRequest{Ref: ref, Registry: reg, Status: ch})
	wait()
	return img, err
}

// EnsurePulled renders --pull and --insecure-registry into req and does
// the pull the policy asks for here, with progress, so that the create
// itself finds the image in the store.
func EnsurePulled(c *cli.Context, e *engine.Engine, req *engine.CreateRequest) error {
	p, err := engine.ParsePullPolicy(c.String(PullFlag.Name))
	if err != nil {
		return UsageError(fmt.Errorf("--pull: %w", err))
	}
	// The engine's pulls trust req.CACerts (--ca-cert) too.
	req.Registry = engine.RegistryOptions{Insecure: c.StringSlice(InsecureRegistryFlag.Name)}
	need, err := e.NeedsPull(c.Context, req.Image, p)
	if err != nil {
		return err
	}
	if need {
		// The request's own errors come before any download.
		if err := e.ValidateCreate(*req); err != nil {
			return err
		}
		if _, err := Pull(c, e, req.Image); err != nil {
			return err
		}
	}
	req.Pull = engine.PullMissing
	if p == engine.PullNever {
		req.Pull = engine.PullNever
	}
	return nil
}
