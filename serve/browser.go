package serve

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/containerd/errdefs"

	"hutch.dev/hutch/browser"
	"hutch.dev/hutch/engine"
)

// browserStartTimeout bounds POST /sandboxes/{id}/browser's start of
// Chromium.
const browserStartTimeout = 60 * time.Second

// startBrowser is POST /sandboxes/{id}/browser, hutch's own call: it
// starts the sandbox's Chromium with its DevTools protocol on
// 127.0.0.1:9222 inside the sandbox (headless, or on the desktop's
// screen with "headless": false), unless it runs already, and answers
// the one URL Playwright's connectOverCDP and Puppeteer's connect take:
// wss://9222-ID.DOMAIN/devtools/browser?hutch_token=TOKEN, the
// sandbox's stream token, which the port routing checks (serveBrowser).
func (s *Server) startBrowser(r *http.Request, tenantName string) (int, any, error) {
	var body struct {
		Headless *bool  `json:"headless"`
		Display  string `json:"display"`
	}
	if err := decodeBody(r, &body); err != nil {
		return 0, nil, err
	}
	display := body.Display
	if body.Headless != nil && !*body.Headless && display == "" {
		display = ":0"
	}
	if display != "" && (body.Headless != nil && *body.Headless) {
		return 0, nil, fmt.Errorf(`"display" names a screen and "headless" is true: want one: %w`, errdefs.ErrInvalidArgument)
	}
	if display != "" && !browser.ValidDisplay(display) {
		return 0, nil, fmt.Errorf("display %q: want an X display such as :0: %w", display, errdefs.ErrInvalidArgument)
	}
	id := r.PathValue("id")
	sb, err := s.owned(r.Context(), tenantName, id)
	if err != nil {
		return 0, nil, err
	}
	if sb.State != engine.StateRunning {
		return 0, nil, fmt.Errorf("sandbox %s is %s: its browser starts only while it runs: %w", sb.ID, sb.State, errdefs.ErrConflict)
	}
	toks, err := s.tokensOf(sb)
	if err != nil {
		return 0, nil, err
	}
	ctx, cancel := context.WithTimeout(r.Context(), browserStartTimeout)
	defer cancel()
	var out bytes.Buffer
	cmd, err := s.place.Processes().Start(ctx, sb.ID, engine.ExecRequest{
		Args: browser.StartCommand(display), Stdout: &out, Stderr: &out,
	})
	if err == nil {
		var code int
		if code, err = cmd.Wait(); err == nil && code != 0 {
			err = fmt.Errorf("exit %d: %s", code, strings.TrimSpace(out.String()))
		}
	}
	if err != nil {
		if errdefs.IsNotFound(err) || strings.Contains(out.String(), "not found") || strings.Contains(out.String(), "No such file") {
			return 0, nil, fmt.Errorf("sandbox %s has no browser to start (the desktop template has one): %v: %w", sb.ID, err, errdefs.ErrFailedPrecondition)
		}
		return 0, nil, fmt.Errorf("sandbox %s: starting its browser: %w", sb.ID, err)
	}
	scheme := "ws"
	if r.TLS != nil {
		scheme = "wss"
	}
	host := fmt.Sprintf("%d-%s.%s", browser.Port, sb.ID, s.cfg.Domain)
	if _, port, err := net.SplitHostPort(r.Host); err == nil && port != "443" && port != "80" {
		host = net.JoinHostPort(host, port)
	}
	s.log.Info("browser started", "sandbox", sb.ID, "tenant", tenantName, "display", display)
	return http.StatusOK, map[string]any{
		"sandboxID": sb.ID,
		"cdpUrl":    browser.URL(scheme, host, toks.Stream),
		"port":      browser.Port,
		"token":     toks.Stream,
		"headless":  display == "",
		"display":   display,
	}, nil
}

// serveBrowser serves a request for port browser.Port of sandbox sb,
// which carried the sandbox's stream token: to its Chromium's DevTools,
// with the rewriting browser.Proxy does.
func (s *Server) serveBrowser(w http.ResponseWriter, r *http.Request, sb *engine.Sandbox, token string) {
	p := &browser.Proxy{
		Dial: func(context.Context) (net.Conn, error) {
			return s.place.DialPort(s.stopCtx, sb.ID, browser.Port)
		},
		Token: token,
		OnError: func(w http.ResponseWriter, status int, msg string) {
			writeError(w, status, "sandbox "+sb.ID+": "+msg)
		},
	}
	_ = http.NewResponseController(w).EnableFullDuplex()
	p.ServeHTTP(w, r)
}
