package engine

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"

	"sbx.dev/sbx/overlay"
)

// setupRepo is the reserved image repository of cached setup results:
// sbx-setup/<key>, key = sha256 of the base image digest and the setup
// commands.
const setupRepo = "sbx-setup/"

// Setup cache states, as PersistState.SetupCache reports them.
const (
	SetupRan = "ran" // the commands ran and their result was cached
	SetupHit = "hit" // the sandbox started from the cached result
)

// setupKey names the cached result of running cmds on image.
func setupKey(img overlay.Image, cmds []string) string {
	b, _ := json.Marshal(struct {
		Image string   `json:"image"`
		Setup []string `json:"setup"`
	}{img.Digest.String(), cmds})
	sum := sha256.Sum256(append([]byte("sbx-setup-v1\n"), b...))
	return setupRepo + hex.EncodeToString(sum[:]) + ":latest"
}

// setupImage returns the image a create with setup commands starts from:
// the cached result if there is one (hit), else img itself.
func (e *Engine) setupImage(ctx context.Context, img overlay.Image, cmds []string) (overlay.Image, string, bool, error) {
	if len(cmds) == 0 {
		return img, "", false, nil
	}
	for _, c := range cmds {
		if strings.TrimSpace(c) == "" {
			return img, "", false, fmt.Errorf("--setup: empty command: %w", errdefs.ErrInvalidArgument)
		}
	}
	key := setupKey(img, cmds)
	cached, err := e.images.Get(ctx, key)
	switch {
	case err == nil:
		return cached, key, true, nil
	case errors.Is(err, errdefs.ErrNotFound):
		return img, key, false, nil
	}
	return img, "", false, err
}

// runSetup runs each setup command in sb with `sh -c` and caches the
// result as image key. A failing command fails the create, with the end of
// its output in the error.
func (e *Engine) runSetup(ctx context.Context, sb *Sandbox, cmds []string, key string) error {
	for i, c := range cmds {
		var out tailBuffer
		code, err := e.Exec(ctx, sb.ID, ExecRequest{Args: []string{"sh", "-c", c}, Stdout: &out, Stderr: &out})
		if err == nil && code != 0 {
			err = fmt.Errorf("exit status %d", code)
		}
		if err != nil {
			return fmt.Errorf("--setup %d (%q) failed: %w; output: %q", i+1, c, err, out.String())
		}
	}
	unlock, err := e.lockSandbox(sb.ID)
	if err != nil {
		return err
	}
	defer unlock()
	if _, err := e.snapshotLocked(ctx, sb, key, "sbx setup: "+strings.Join(cmds, " && ")); err != nil {
		return fmt.Errorf("cache setup result: %w", err)
	}
	sb.SetupCache, sb.SetupImage = SetupRan, key
	log.G(ctx).WithField("image", key).Debug("cached setup result")
	return nil
}

// tailBuffer keeps the last 2 KiB written to it.
type tailBuffer struct{ b []byte }

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.b = append(t.b, p...)
	if len(t.b) > 2048 {
		t.b = t.b[len(t.b)-2048:]
	}
	return len(p), nil
}

func (t *tailBuffer) String() string { return strings.TrimSpace(string(t.b)) }

var _ io.Writer = (*tailBuffer)(nil)

// PruneImages removes the cached setup results no sandbox uses, then every
// blob and unpacked filesystem no image or sandbox references, and
// interrupted snapshots and checkpoints. It returns the bytes freed.
func (e *Engine) PruneImages(ctx context.Context) (int64, error) {
	all, err := e.List(ctx)
	if err != nil {
		return 0, err
	}
	used := map[string]bool{}
	for _, sb := range all {
		used[sb.Image] = true
	}
	imgs, err := e.images.List(ctx)
	if err != nil {
		return 0, err
	}
	for _, img := range imgs {
		if strings.HasPrefix(img.Name, setupRepo) && !used[img.Name] {
			if err := e.images.Remove(ctx, img.Name); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
				return 0, err
			}
		}
	}
	return e.images.Prune(ctx)
}

// setPersistFields records a create's setup and lifetime in sb.
func setPersistFields(sb *Sandbox, req CreateRequest) {
	sb.Setup = req.Setup
	if req.Timeout > 0 {
		sb.Timeout = req.Timeout.String()
		sb.OnTimeout = req.OnTimeout
		if sb.OnTimeout == "" {
			sb.OnTimeout = OnTimeoutPause
		}
	}
}

// finishCreate runs or records the setup of a started sandbox and starts
// its lifetime watchdog; the undo of the create covers both.
func (e *Engine) finishCreate(ctx context.Context, sb *Sandbox, req CreateRequest, key string, hit bool) error {
	switch {
	case key == "":
	case hit:
		sb.SetupCache, sb.SetupImage = SetupHit, key
	default:
		if err := e.runSetup(ctx, sb, req.Setup, key); err != nil {
			return err
		}
	}
	if err := e.startWatchdog(sb); err != nil {
		return err
	}
	return e.save(sb)
}
