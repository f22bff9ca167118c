package serve

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/coder/websocket"
	"github.com/containerd/errdefs"

	"hutch.dev/hutch/browser"
	"hutch.dev/hutch/engine"
	"hutch.dev/hutch/screen"
)

// hutch's own calls for desktop sandboxes: the browser's DevTools
// endpoint, the screen's VNC stream and screen recordings. Each runs a command of package browser
// or screen in the sandbox (runIn).

// Bounds of those commands: Chromium's start, a recording's start or stop.
const (
	browserStartTimeout = 60 * time.Second
	recordTimeout       = 30 * time.Second
	screenStartTimeout  = 30 * time.Second
)

// startBrowser is POST /sandboxes/{id}/browser: it starts the sandbox's
// Chromium with its DevTools protocol on 127.0.0.1:9222 inside the
// sandbox (headless, or on the desktop's screen with "headless": false),
// unless it runs already, and answers the one URL Playwright's
// connectOverCDP and Puppeteer's connect take:
// wss://9222-ID.DOMAIN/devtools/browser?hutch_token=TOKEN, the sandbox's
// stream token, which the port routing checks (serveBrowser).
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
	sb, err := s.runningOwned(r, tenantName)
	if err != nil {
		return 0, nil, err
	}
	tok, err := s.streamToken(sb)
	if err != nil {
		return 0, nil, err
	}
	if _, err := s.runIn(r.Context(), sb, browser.StartCommand(display), browserStartTimeout, "has no browser to start (the desktop template has one)"); err != nil {
		return 0, nil, err
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
		"cdpUrl":    browser.URL(scheme, host, tok),
		"port":      browser.Port,
		"token":     tok,
		"headless":  display == "",
		"display":   display,
	}, nil
}

// serveBrowser serves a request for port browser.Port of sandbox sb,
// which carried the sandbox's stream token: to its Chromium's DevTools,
// with the rewriting browser.Proxy does, over the server's transport
// into that port (kept per sandbox, dropped when it pauses or goes).
func (s *Server) serveBrowser(w http.ResponseWriter, r *http.Request, sb *engine.Sandbox, token string) {
	p := &browser.Proxy{
		Transport: s.ports.transport(sb.ID, browser.Port, func() (net.Conn, error) {
			return s.place.DialPort(s.stopCtx, sb.ID, browser.Port)
		}),
		Token: token,
		OnError: func(w http.ResponseWriter, status int, msg string) {
			writeError(w, status, "sandbox "+sb.ID+": "+msg)
		},
	}
	_ = http.NewResponseController(w).EnableFullDuplex()
	p.ServeHTTP(w, r)
}

// startRecording is POST /sandboxes/{id}/recordings: it starts recording
// a desktop sandbox's screen (ffmpeg, H.264 in MP4, "fps" frames a
// second, default 10) and answers 201 with the recording's ID and the
// file in the sandbox it is written to.
func (s *Server) startRecording(r *http.Request, tenantName string) (int, any, error) {
	var body struct {
		FPS int `json:"fps"`
	}
	if err := decodeBody(r, &body); err != nil {
		return 0, nil, err
	}
	if body.FPS == 0 {
		body.FPS = 10
	}
	if body.FPS < 1 || body.FPS > 30 {
		return 0, nil, fmt.Errorf("fps %d: want 1 to 30 frames a second: %w", body.FPS, errdefs.ErrInvalidArgument)
	}
	sb, err := s.runningOwned(r, tenantName)
	if err != nil {
		return 0, nil, err
	}
	rec := screen.NewID()
	size, err := s.runIn(r.Context(), sb, screen.StartCommand(rec, body.FPS), recordTimeout, "has no screen to record (the desktop template has one)")
	if err != nil {
		return 0, nil, err
	}
	s.log.Info("recording started", "sandbox", sb.ID, "tenant", tenantName, "recording", rec)
	return http.StatusCreated, map[string]any{
		"recordingID": rec, "sandboxID": sb.ID, "path": screen.File(rec), "fps": body.FPS, "size": size,
	}, nil
}

// stopRecording is POST /sandboxes/{id}/recordings/{recordingID}/stop:
// ffmpeg finishes the file, which the caller then reads like any other
// (GET /files?path=PATH on envd, the SDK's files.read).
func (s *Server) stopRecording(r *http.Request, tenantName string) (int, any, error) {
	var body struct{}
	if err := decodeBody(r, &body); err != nil {
		return 0, nil, err
	}
	rec := r.PathValue("recordingID")
	if err := screen.CheckID(rec); err != nil {
		return 0, nil, err
	}
	sb, err := s.runningOwned(r, tenantName)
	if err != nil {
		return 0, nil, err
	}
	out, err := s.runIn(r.Context(), sb, screen.StopCommand(rec), recordTimeout, "has no screen to record (the desktop template has one)")
	if err != nil {
		return 0, nil, err
	}
	n, _ := strconv.ParseInt(out, 10, 64)
	s.log.Info("recording stopped", "sandbox", sb.ID, "tenant", tenantName, "recording", rec, "bytes", n)
	return http.StatusOK, map[string]any{"recordingID": rec, "sandboxID": sb.ID, "path": screen.File(rec), "bytes": n}, nil
}

// runningOwned is the running sandbox {id} of tenant.
func (s *Server) runningOwned(r *http.Request, tenantName string) (*engine.Sandbox, error) {
	sb, err := s.owned(r.Context(), tenantName, r.PathValue("id"))
	if err != nil {
		return nil, err
	}
	if sb.State != engine.StateRunning {
		return nil, fmt.Errorf("sandbox %s is %s, not running: %w", sb.ID, sb.State, errdefs.ErrConflict)
	}
	return sb, nil
}

// runIn runs one of package browser's or screen's commands in sb, for at
// most timeout, and returns its output. Their statuses: 127 (the command
// or a tool it needs is missing) says the sandbox lacks what the call
// needs, with missing; 3 is a recording that is not there; any other
// failure is the command's own message.
func (s *Server) runIn(ctx context.Context, sb *engine.Sandbox, args []string, timeout time.Duration, missing string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var out, errb bytes.Buffer
	cmd, err := s.place.Processes().Start(ctx, sb.ID, engine.ExecRequest{Args: args, Stdout: &out, Stderr: &errb})
	if err != nil {
		return "", err
	}
	code, err := cmd.Wait()
	msg := strings.TrimSpace(errb.String())
	switch {
	case err != nil:
		return "", err
	case code == 3:
		return "", fmt.Errorf("sandbox %s: %s: %w", sb.ID, msg, errdefs.ErrNotFound)
	case code == 127 || strings.Contains(msg, "desktop image"):
		return "", fmt.Errorf("sandbox %s %s: %s: %w", sb.ID, missing, msg, errdefs.ErrFailedPrecondition)
	case code != 0:
		return "", fmt.Errorf("sandbox %s: exit %d: %s", sb.ID, code, msg)
	}
	return strings.TrimSpace(out.String()), nil
}

// startScreen is POST /sandboxes/{id}/screen: it starts the VNC server of
// the sandbox's screen (x11vnc on the sandbox's 127.0.0.1:5909, display
// "display", default :0), unless it runs already, and answers the
// WebSocket URL a noVNC client connects to:
// wss://5909-ID.DOMAIN/?hutch_token=TOKEN, the sandbox's stream token,
// which the port routing checks before it bridges the WebSocket to the
// VNC server (serveScreen). The VNC server itself asks no password: the
// token is the key, as for the browser's DevTools.
func (s *Server) startScreen(r *http.Request, tenantName string) (int, any, error) {
	var body struct {
		Display string `json:"display"`
	}
	if err := decodeBody(r, &body); err != nil {
		return 0, nil, err
	}
	display := body.Display
	if display == "" {
		display = screen.Display
	}
	if !browser.ValidDisplay(display) {
		return 0, nil, fmt.Errorf("display %q: want an X display such as :0: %w", display, errdefs.ErrInvalidArgument)
	}
	sb, err := s.runningOwned(r, tenantName)
	if err != nil {
		return 0, nil, err
	}
	tok, err := s.streamToken(sb)
	if err != nil {
		return 0, nil, err
	}
	if _, err := s.runIn(r.Context(), sb, screen.VNCStartCommand(display), screenStartTimeout, "has no screen to show (the desktop template has one)"); err != nil {
		return 0, nil, err
	}
	scheme := "ws"
	if r.TLS != nil {
		scheme = "wss"
	}
	host := fmt.Sprintf("%d-%s.%s", screen.VNCPort, sb.ID, s.cfg.Domain)
	if _, port, err := net.SplitHostPort(r.Host); err == nil && port != "443" && port != "80" {
		host = net.JoinHostPort(host, port)
	}
	u := url.URL{Scheme: scheme, Host: host, Path: "/", RawQuery: url.Values{browser.TokenParam: {tok}}.Encode()}
	return http.StatusOK, map[string]any{
		"sandboxID": sb.ID,
		"url":       u.String(),
		"port":      screen.VNCPort,
		"token":     tok,
		"display":   display,
	}, nil
}

// serveScreen serves a request for port screen.VNCPort of sandbox sb,
// which carried the sandbox's stream token: a WebSocket whose binary
// messages are the RFB stream of the sandbox's VNC server (what
// websockify serves noVNC). It ends with ctx: when the sandbox is killed
// or its tokens are replaced.
func (s *Server) serveScreen(ctx context.Context, w http.ResponseWriter, r *http.Request, sb *engine.Sandbox) {
	if !strings.EqualFold(r.Header.Get("Upgrade"), "websocket") {
		writeError(w, http.StatusBadRequest, "sandbox "+sb.ID+": port "+strconv.Itoa(screen.VNCPort)+" is the screen's VNC stream: open it as a WebSocket (noVNC)")
		return
	}
	vnc, err := s.place.DialPort(ctx, sb.ID, screen.VNCPort)
	if err != nil {
		writeError(w, http.StatusBadGateway, "sandbox "+sb.ID+": the screen's VNC server does not answer (POST /sandboxes/"+sb.ID+"/screen starts it): "+err.Error())
		return
	}
	defer vnc.Close()
	// The stream token authenticates; the Origin is not what keeps
	// another site out (it cannot know the token).
	c, err := websocket.Accept(w, r, &websocket.AcceptOptions{Subprotocols: []string{"binary"}, InsecureSkipVerify: true})
	if err != nil {
		return
	}
	c.SetReadLimit(1 << 20)
	ws := websocket.NetConn(ctx, c, websocket.MessageBinary)
	defer ws.Close()
	done := make(chan struct{}, 2)
	go func() { _, _ = io.Copy(vnc, ws); done <- struct{}{} }()
	go func() { _, _ = io.Copy(ws, vnc); done <- struct{}{} }()
	select {
	case <-done:
	case <-ctx.Done():
	}
}
