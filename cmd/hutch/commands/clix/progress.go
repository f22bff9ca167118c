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

	"hutch.dev/hutch/engine"
)

// ProgressFlag is --progress for commands that build images.
var ProgressFlag = &cli.StringFlag{Name: "progress", Value: "auto", Usage: "build progress: auto, plain or quiet"}

// Progress shows BuildKit's progress on w in the --progress mode of c. It
// returns the channel to hand to the build, and a function that waits for
// the display to finish once the build has closed the channel.
func Progress(c *cli.Context, w io.Writer) (chan *client.SolveStatus, func(), error) {
	var mode progressui.DisplayMode
	switch m := c.String("progress"); m {
	case "auto", "":
		mode = progressui.AutoMode
	case "plain":
		mode = progressui.PlainMode
	case "quiet":
		mode = progressui.QuietMode
	default:
		return nil, nil, UsageError(fmt.Errorf("--progress %q: want auto, plain or quiet", m))
	}
	d, err := progressui.NewDisplay(w, mode)
	if err != nil {
		return nil, nil, err
	}
	ch := make(chan *client.SolveStatus)
	done := make(chan struct{})
	go func() {
		defer close(done)
		// The display drains ch until the build closes it, even when the
		// build is interrupted.
		_, _ = d.UpdateFrom(context.Background(), ch)
	}()
	return ch, func() { <-done }, nil
}

// EnsureDefaultImage builds the default image with progress on stderr if
// req names no image and the store lacks the default, saying so first: the
// first sandbox on a fresh host. req's own errors come first.
func EnsureDefaultImage(c *cli.Context, e *engine.Engine, req engine.CreateRequest) error {
	switch need, err := e.NeedDefaultImage(c.Context, req); {
	case err != nil:
		return err
	case need == engine.DefaultImageReady:
		return nil
	case need == engine.DefaultImageQuick:
		_, err := e.BuildBase(c.Context, engine.BaseRequest{})
		return err
	}
	w := c.App.ErrWriter
	if w == nil {
		w = os.Stderr
	}
	fmt.Fprintf(w, "hutch: the default image %s is not built yet; building it now, once (this takes a few minutes)\n", engine.DefaultImage)
	ch, wait, err := Progress(c, w)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(c.Context, os.Interrupt, syscall.SIGTERM)
	defer stop()
	_, err = e.BuildBase(ctx, engine.BaseRequest{Log: w, Status: ch})
	wait()
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "hutch: built %s\n", engine.DefaultImage)
	return nil
}
