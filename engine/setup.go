package engine

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"

	"hutch.dev/hutch/overlay"
	"hutch.dev/hutch/policy"
)

// setupRepo is the reserved image repository of cached setup results:
// hutch-setup/<key>, key = setupKey.
const setupRepo = "hutch-setup/"

// Setup cache states, as PersistState.SetupCache reports them.
const (
	SetupRan = "ran" // the commands ran and their result was cached
	SetupHit = "hit" // the sandbox started from the cached result
)

// setupInput is everything that can change what setup commands leave
// behind: a create reuses a cached result only if all of it is equal.
// Secrets enter only as secretsMAC, never as values.
type setupInput struct {
	Scope   string   `json:"scope"`
	Image   string   `json:"image"`
	Setup   []string `json:"setup"`
	Env     []string `json:"env"`
	Workdir string   `json:"workdir"`
	Network string   `json:"network"`
	Allow   []string `json:"allow"`
	DNS     []string `json:"dns"`
	CACerts [][]byte `json:"ca_certs"`
	Secrets string   `json:"secrets"`
}

// setupKey names the cached result of running req's setup on img for
// scope. secretsMAC identifies the secrets (secretsMAC).
func setupKey(img overlay.Image, req CreateRequest, scope, secretsMAC string) string {
	in := setupInput{
		Scope: scope, Image: img.Digest.String(), Setup: req.Setup,
		Env: req.Env, Workdir: req.Workdir, Network: req.Network,
		Allow: slices.Sorted(slices.Values(req.Allow)), DNS: req.DNS, Secrets: secretsMAC,
	}
	for _, c := range req.CACerts {
		in.CACerts = append(in.CACerts, c.PEM)
	}
	b, _ := json.Marshal(in)
	sum := sha256.Sum256(append([]byte("hutch-setup-v2\n"), b...))
	return setupRepo + hex.EncodeToString(sum[:]) + ":latest"
}

// setupMACKey is the state root's secret key for secretsMAC, made on first
// use: without it a MAC of a low-entropy secret could be brute-forced from
// the image name.
func (e *Engine) setupMACKey() ([]byte, error) {
	p := filepath.Join(e.opts.Root, "setup-cache.key")
	if k, err := os.ReadFile(p); err == nil && len(k) == 32 {
		return k, nil
	}
	k := make([]byte, 32)
	if _, err := rand.Read(k); err != nil {
		return nil, err
	}
	tmp := p + ".tmp." + strconv.Itoa(os.Getpid())
	if err := os.WriteFile(tmp, k, 0o600); err != nil {
		return nil, fmt.Errorf("setup cache key: %w", err)
	}
	// Link rather than rename: of two first creates, one key wins.
	err := os.Link(tmp, p)
	os.Remove(tmp)
	if err != nil && !errors.Is(err, os.ErrExist) {
		return nil, fmt.Errorf("setup cache key: %w", err)
	}
	if k, err := os.ReadFile(p); err == nil && len(k) == 32 {
		return k, nil
	}
	return nil, fmt.Errorf("setup cache key %s: unreadable or not 32 bytes", p)
}

// secretsMAC identifies a set of secrets, names and values, by an HMAC
// under key: equal secrets give equal MACs, and the MAC reveals nothing of
// the values to whoever lacks the key.
func secretsMAC(key []byte, secrets []policy.Secret) string {
	if len(secrets) == 0 {
		return ""
	}
	sorted := slices.Clone(secrets)
	slices.SortFunc(sorted, func(a, b policy.Secret) int { return strings.Compare(a.Name, b.Name) })
	m := hmac.New(sha256.New, key)
	for _, s := range sorted {
		// Length-prefixed, so that no two sets encode alike.
		fmt.Fprintf(m, "%d:%s%d:", len(s.Name), s.Name, len(s.Value))
		m.Write(s.Value)
	}
	return hex.EncodeToString(m.Sum(nil))
}

// setupImageFor returns the image a create with setup commands starts
// from: the cached result if there is one (hit), else img itself. The cache is
// keyed on everything that can change the result (setupInput) and on
// scope, which callers serving several tenants set to the tenant so that
// no tenant starts from another's setup.
func (e *Engine) setupImageFor(ctx context.Context, img overlay.Image, req CreateRequest, secrets []policy.Secret, scope string) (overlay.Image, string, bool, error) {
	cmds := req.Setup
	if len(cmds) == 0 {
		return img, "", false, nil
	}
	for _, c := range cmds {
		if strings.TrimSpace(c) == "" {
			return img, "", false, fmt.Errorf("--setup: empty command: %w", errdefs.ErrInvalidArgument)
		}
	}
	var mac string
	if len(secrets) > 0 {
		k, err := e.setupMACKey()
		if err != nil {
			return img, "", false, err
		}
		mac = secretsMAC(k, secrets)
	}
	key := setupKey(img, req, scope, mac)
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
func (e *Engine) runSetup(ctx context.Context, sb *record, cmds []string, key string) error {
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
	if _, err := e.snapshotLocked(ctx, sb, key, "hutch setup: "+strings.Join(cmds, " && ")); err != nil {
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
	all, err := e.list(ctx)
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
func setPersistFields(sb *record, req CreateRequest) {
	sb.Setup = req.Setup
	if req.Timeout > 0 {
		sb.Timeout = req.Timeout.String()
		sb.OnTimeout = req.OnTimeout
		if sb.OnTimeout == "" {
			sb.OnTimeout = OnTimeoutPause
			if sb.Docker {
				// Not checkpointable (checkpointable).
				sb.OnTimeout = OnTimeoutStop
			}
		}
	}
}

// finishCreate runs or records the setup of a started sandbox and starts
// its lifetime watchdog; the undo of the create covers both.
func (e *Engine) finishCreate(ctx context.Context, sb *record, req CreateRequest, key string, hit bool) error {
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
