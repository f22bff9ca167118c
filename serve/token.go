package serve

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"path/filepath"
	"strconv"
	"sync"

	"github.com/containerd/errdefs"

	"hutch.dev/hutch/credential"
	"hutch.dev/hutch/engine"
	"hutch.dev/hutch/serve/placement"
)

// The server's credential files, under its state directory.
const (
	// tokenKeyFile is the key each sandbox's tokens are derived with
	// (credential.Key): removing it revokes every token at once.
	tokenKeyFile = "token.key"
	// APIKeyFile is the API key of a server without tenants, made on
	// its first start (credential.LoadAPIKey).
	APIKeyFile = "api.key"
)

func loadTokenKey(dir string) (credential.Key, error) {
	return credential.LoadKey(filepath.Join(dir, tokenKeyFile))
}

// tokenGeneration is the generation of sb's tokens: its label, 0 if it
// has none. A label that is not a generation is an error, so that no
// token opens the sandbox rather than those of generation 0.
func tokenGeneration(sb *engine.Sandbox) (uint64, error) {
	v, ok := sb.Labels[placement.LabelTokenGeneration]
	if !ok {
		return 0, nil
	}
	g, err := strconv.ParseUint(v, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("sandbox %s: its token generation %q is not a number: %w", sb.ID, v, errdefs.ErrFailedPrecondition)
	}
	return g, nil
}

// sandboxTokens are sb's tokens of its current generation.
type sandboxTokens struct {
	// Envd opens its data plane (X-Access-Token).
	Envd string
	// Traffic opens its port previews when its public traffic is off
	// (E2b-Traffic-Access-Token).
	Traffic string
}

func (s *Server) tokensOf(sb *engine.Sandbox) (sandboxTokens, error) {
	g, err := tokenGeneration(sb)
	if err != nil {
		return sandboxTokens{}, err
	}
	return sandboxTokens{
		Envd:    s.tokens.Token(credential.Envd, sb.ID, g),
		Traffic: s.tokens.Token(credential.Traffic, sb.ID, g),
	}, nil
}

// streamToken is sb's stream token of its current generation: it opens
// its browser's DevTools endpoint (browser.TokenParam in the URL serve
// gives out). Apart from tokensOf, which every data-plane request asks.
func (s *Server) streamToken(sb *engine.Sandbox) (string, error) {
	g, err := tokenGeneration(sb)
	if err != nil {
		return "", err
	}
	return s.tokens.Token(credential.Stream, sb.ID, g), nil
}

// rotateTokens is POST /sandboxes/{id}/tokens, hutch's own call: the
// sandbox's tokens of its next generation replace those it had, which
// open nothing from then on, and the requests they opened that are still
// under way end. It answers the sandbox as connect does, with its new
// tokens.
func (s *Server) rotateTokens(r *http.Request, tenantName string) (int, any, error) {
	var body struct{}
	if err := decodeBody(r, &body); err != nil {
		return 0, nil, err
	}
	id := r.PathValue("id")
	if _, err := s.owned(r.Context(), tenantName, id); err != nil {
		return 0, nil, err
	}
	// One generation at a time, and none while the sandbox is paused or
	// resumed (a pause on Kubernetes copies its pod).
	unlock := s.locks.Lock(id)
	defer unlock()
	sb, err := s.owned(r.Context(), tenantName, id)
	if err != nil {
		return 0, nil, err
	}
	if sb.State != engine.StateRunning && sb.State != engine.StatePaused {
		return 0, nil, fmt.Errorf("sandbox %s is %s: only a running or paused sandbox's tokens are replaced: %w", sb.ID, sb.State, errdefs.ErrConflict)
	}
	g, err := tokenGeneration(sb)
	if err != nil {
		return 0, nil, err
	}
	if sb, err = s.place.SetTokenGeneration(context.WithoutCancel(r.Context()), sb.ID, g+1); err != nil {
		return 0, nil, err
	}
	s.cuts.cut(sb.ID, errTokensReplaced)
	s.log.Info("tokens replaced", "sandbox", sb.ID, "tenant", tenantName, "generation", g+1)
	out, err := s.sandboxJSON(sb)
	if err != nil {
		return 0, nil, err
	}
	return http.StatusOK, out, nil
}

// Why tokenCuts ended a request: its context's cause.
var (
	errTokensReplaced = errors.New("the sandbox's tokens were replaced")
	// errSandboxGone: the sandbox was killed. Its requests under way
	// are aborted (the connection reset, an HTTP/2 stream's RST_STREAM),
	// as E2B's proxy drops them, so that an SDK asks the health check
	// and tells its user the sandbox was killed or reached its end of
	// life.
	errSandboxGone = errors.New("the sandbox was killed")
)

// tokenCuts ends the data-plane requests under way of a sandbox: those
// its tokens opened once the tokens are replaced (a command's stream,
// its input, a preview's WebSocket), and all of them when it is killed.
type tokenCuts struct {
	// mu guards open: each sandbox's requests under way, an entry only
	// while it has some.
	mu   sync.Mutex
	open map[string]*cutSet
}

// cutSet is the cancels of one sandbox's requests under way, each
// with whether only a kill ends it (a public preview's, which no token
// opened).
type cutSet struct {
	cancels map[*context.CancelCauseFunc]bool
}

// hold registers a request for sandbox id that cancel ends; release
// unregisters it. A request registers before it reads the sandbox's
// generation, so that a cut after that read ends it.
func (c *tokenCuts) hold(id string, cancel context.CancelCauseFunc) (release func()) {
	return c.add(id, cancel, false)
}

// holdKill registers a request for sandbox id that only the sandbox's
// kill ends.
func (c *tokenCuts) holdKill(id string, cancel context.CancelCauseFunc) (release func()) {
	return c.add(id, cancel, true)
}

func (c *tokenCuts) add(id string, cancel context.CancelCauseFunc, killOnly bool) (release func()) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.open == nil {
		c.open = map[string]*cutSet{}
	}
	set, ok := c.open[id]
	if !ok {
		set = &cutSet{cancels: map[*context.CancelCauseFunc]bool{}}
		c.open[id] = set
	}
	p := &cancel
	set.cancels[p] = killOnly
	return func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		delete(set.cancels, p)
		if len(set.cancels) == 0 && c.open[id] == set {
			delete(c.open, id)
		}
	}
}

// cut ends the requests of sandbox id registered now, for cause: all of
// them for errSandboxGone, else those a token opened.
func (c *tokenCuts) cut(id string, cause error) {
	c.mu.Lock()
	var cancels []context.CancelCauseFunc
	if set := c.open[id]; set != nil {
		for p, killOnly := range set.cancels {
			if killOnly && cause != errSandboxGone {
				continue
			}
			cancels = append(cancels, *p)
			delete(set.cancels, p)
		}
		if len(set.cancels) == 0 {
			delete(c.open, id)
		}
	}
	c.mu.Unlock()
	for _, cancel := range cancels {
		cancel(cause)
	}
}

// count counts the sandboxes with requests registered.
func (c *tokenCuts) count() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.open)
}
