package mcp

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/containerd/errdefs"
	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
)

// --- screenshot, click, type, key, scroll, open_url ------------------------------
//
// Computer use: a sandbox of the desktop image has an X display (:0)
// with XFCE and Chromium on it. These tools look at it and work it the
// way @e2b/desktop does, through commands in the sandbox: scrot for the
// screenshot, xdotool for the mouse and keyboard, xdg-open for a URL. A
// sandbox without a display says so.

const (
	toolScreenshot = "screenshot"
	toolClick      = "click"
	toolType       = "type"
	toolKey        = "key"
	toolScroll     = "scroll"
	toolOpenURL    = "open_url"
)

// screenDisplay is the display the tools work: the desktop template's.
const screenDisplay = ":0"

// screenTimeout bounds each of the tools' commands.
const screenTimeout = 30 * time.Second

type screenshotArgs struct {
	sandboxArg
}

type screenshotResult struct {
	Width  int `json:"width"`
	Height int `json:"height"`
	Bytes  int `json:"bytes" jsonschema:"the PNG's size"`
}

type clickArgs struct {
	sandboxArg
	X      *int   `json:"x,omitempty" jsonschema:"the pixel column to click at (with y); default: where the pointer is"`
	Y      *int   `json:"y,omitempty" jsonschema:"the pixel row to click at (with x)"`
	Button string `json:"button,omitempty" jsonschema:"left (default), right or middle"`
	Double bool   `json:"double,omitempty" jsonschema:"a double click"`
}

type typeArgs struct {
	sandboxArg
	Text string `json:"text" jsonschema:"the text to type, as keystrokes into the focused window"`
}

type keyArgs struct {
	sandboxArg
	Keys string `json:"keys" jsonschema:"a key or a combination joined with +: Return, Escape, Tab, BackSpace, ctrl+s, ctrl+shift+t, alt+F4 (X keysym names; ctrl, alt, shift and super as modifiers)"`
}

type scrollArgs struct {
	sandboxArg
	Direction string `json:"direction,omitempty" jsonschema:"down (default), up, left or right"`
	Amount    int    `json:"amount,omitempty" jsonschema:"how many wheel steps (default 3, at most 50)"`
	X         *int   `json:"x,omitempty" jsonschema:"the pixel column to scroll at (with y); default: where the pointer is"`
	Y         *int   `json:"y,omitempty" jsonschema:"the pixel row to scroll at (with x)"`
}

type openURLArgs struct {
	sandboxArg
	URL string `json:"url" jsonschema:"an http or https URL to open in the desktop's browser"`
}

type screenResult struct {
	Done string `json:"done"`
}

func (s *Server) addScreenTools() {
	add(s, &sdk.Tool{Name: toolScreenshot, Title: "Take a screenshot",
		Description: "Take a screenshot of a desktop sandbox's screen (a sandbox of image \"desktop\"), returned as a PNG image with its size. " +
			"Coordinates for click and scroll are pixels of this image, from its top left corner.",
		Annotations: &sdk.ToolAnnotations{ReadOnlyHint: true, OpenWorldHint: &no},
	}, nil, s.screenshot)
	add(s, &sdk.Tool{Name: toolClick, Title: "Click",
		Description: "Move the pointer to x, y on a desktop sandbox's screen (if given) and click a mouse button there: left (default), right or middle, once or double.",
		Annotations: &sdk.ToolAnnotations{DestructiveHint: &no, OpenWorldHint: &no},
	}, map[string][]any{"button": {"left", "right", "middle"}}, s.click)
	add(s, &sdk.Tool{Name: toolType, Title: "Type text",
		Description: "Type text on a desktop sandbox's keyboard, into the window that has the focus (click it first). A newline presses Return.",
		Annotations: &sdk.ToolAnnotations{DestructiveHint: &no, OpenWorldHint: &no},
	}, nil, s.typeText)
	add(s, &sdk.Tool{Name: toolKey, Title: "Press keys",
		Description: "Press a key or a key combination on a desktop sandbox's keyboard: Return, Escape, Tab, ctrl+s, ctrl+shift+t, alt+F4.",
		Annotations: &sdk.ToolAnnotations{DestructiveHint: &no, OpenWorldHint: &no},
	}, nil, s.pressKeys)
	add(s, &sdk.Tool{Name: toolScroll, Title: "Scroll",
		Description: "Turn the mouse wheel on a desktop sandbox's screen: down (default), up, left or right, amount steps, at x, y if given.",
		Annotations: &sdk.ToolAnnotations{DestructiveHint: &no, OpenWorldHint: &no},
	}, map[string][]any{"direction": {"down", "up", "left", "right"}}, s.scroll)
	add(s, &sdk.Tool{Name: toolOpenURL, Title: "Open a URL",
		Description: "Open an http or https URL in a desktop sandbox's browser (Chromium), on its screen. The sandbox's network policy applies: a sandbox without network reaches only its own servers.",
		Annotations: &sdk.ToolAnnotations{DestructiveHint: &no, OpenWorldHint: &yes},
	}, nil, s.openURL)
}

// xdotool runs xdotool with args on the sandbox's display.
func (s *Server) xdotool(ctx context.Context, ref string, args ...string) error {
	return s.onScreen(ctx, ref, append([]string{"xdotool"}, args...))
}

// onScreen runs args on the sandbox's display and fails unless it
// exits 0; a sandbox without the desktop's tools or display says so.
func (s *Server) onScreen(ctx context.Context, ref string, args []string) error {
	if err := checkRef(ref); err != nil {
		return err
	}
	res, err := s.be.exec(ctx, ref, execSpec{Args: args, Env: map[string]string{"DISPLAY": screenDisplay}, Timeout: screenTimeout})
	if err != nil {
		return err
	}
	if res.missing {
		return fmt.Errorf("%s is not installed in %s: create the sandbox with image \"desktop\", which has a screen: %w", args[0], res.where, errdefs.ErrFailedPrecondition)
	}
	if res.ExitCode != 0 {
		msg := strings.TrimSpace(res.Stderr + res.Stdout)
		if strings.Contains(msg, "Can't open display") || strings.Contains(msg, "cannot open display") || strings.Contains(msg, "Failed creating new xdo") {
			return fmt.Errorf("sandbox %s has no screen on %s (create it with image \"desktop\"): %s: %w", ref, screenDisplay, msg, errdefs.ErrFailedPrecondition)
		}
		return fmt.Errorf("%s exited %d: %s", args[0], res.ExitCode, msg)
	}
	return nil
}

func (s *Server) screenshot(ctx context.Context, a screenshotArgs) (*sdk.CallToolResult, screenshotResult, error) {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	path := "/tmp/hutch-screenshot-" + hex.EncodeToString(b) + ".png"
	if err := s.onScreen(ctx, a.SandboxID, []string{"scrot", "--pointer", "--overwrite", path}); err != nil {
		return nil, screenshotResult{}, err
	}
	defer func() {
		_ = s.be.removeFile(context.WithoutCancel(ctx), a.SandboxID, path, false)
	}()
	var png bytes.Buffer
	if err := s.be.readFile(ctx, a.SandboxID, path, &png); err != nil {
		return nil, screenshotResult{}, err
	}
	w, h, err := pngSize(png.Bytes())
	if err != nil {
		return nil, screenshotResult{}, fmt.Errorf("the screenshot: %w", err)
	}
	r := screenshotResult{Width: w, Height: h, Bytes: png.Len()}
	return &sdk.CallToolResult{Content: []sdk.Content{
		&sdk.TextContent{Text: fmt.Sprintf("screenshot of %dx%d pixels", w, h)},
		&sdk.ImageContent{Data: png.Bytes(), MIMEType: "image/png"},
	}}, r, nil
}

// pngSize is the width and height in a PNG's header.
func pngSize(b []byte) (int, int, error) {
	if len(b) < 24 || string(b[1:4]) != "PNG" || string(b[12:16]) != "IHDR" {
		return 0, 0, fmt.Errorf("not a PNG (%d bytes)", len(b))
	}
	be := func(p []byte) int { return int(p[0])<<24 | int(p[1])<<16 | int(p[2])<<8 | int(p[3]) }
	return be(b[16:20]), be(b[20:24]), nil
}

// point checks an optional x, y pair.
func point(x, y *int) ([]string, error) {
	switch {
	case x == nil && y == nil:
		return nil, nil
	case x == nil || y == nil:
		return nil, fmt.Errorf("x and y: give both or neither: %w", errdefs.ErrInvalidArgument)
	case *x < 0 || *y < 0 || *x > 16384 || *y > 16384:
		return nil, fmt.Errorf("x %d, y %d: want pixels of the screen, from 0: %w", *x, *y, errdefs.ErrInvalidArgument)
	}
	return []string{"mousemove", "--sync", strconv.Itoa(*x), strconv.Itoa(*y)}, nil
}

func (s *Server) click(ctx context.Context, a clickArgs) (*sdk.CallToolResult, screenResult, error) {
	button := map[string]string{"": "1", "left": "1", "middle": "2", "right": "3"}[a.Button]
	if button == "" {
		return nil, screenResult{}, fmt.Errorf("button %q: want left, right or middle: %w", a.Button, errdefs.ErrInvalidArgument)
	}
	args, err := point(a.X, a.Y)
	if err != nil {
		return nil, screenResult{}, err
	}
	// A press held as a hand holds it, after the pointer has rested:
	// GTK's buttons (XFCE's panel launchers among them) ignore a press
	// and release that xdotool's click sends in the same instant as the
	// move.
	args = append(args, "sleep", "0.15", "mousedown", button, "sleep", "0.1", "mouseup", button)
	if a.Double {
		args = append(args, "sleep", "0.08", "mousedown", button, "sleep", "0.05", "mouseup", button)
	}
	if err := s.xdotool(ctx, a.SandboxID, args...); err != nil {
		return nil, screenResult{}, err
	}
	what := fmt.Sprintf("clicked %s", nonEmpty(a.Button, "left"))
	if a.Double {
		what = "double-" + what
	}
	if a.X != nil {
		what += fmt.Sprintf(" at %d, %d", *a.X, *a.Y)
	}
	return doneResult(what)
}

func (s *Server) typeText(ctx context.Context, a typeArgs) (*sdk.CallToolResult, screenResult, error) {
	if a.Text == "" {
		return nil, screenResult{}, fmt.Errorf("text is empty: %w", errdefs.ErrInvalidArgument)
	}
	if len(a.Text) > 64<<10 {
		return nil, screenResult{}, fmt.Errorf("text of %d bytes: at most 65536 at once: %w", len(a.Text), errdefs.ErrInvalidArgument)
	}
	if err := s.xdotool(ctx, a.SandboxID, "type", "--delay", "12", "--", a.Text); err != nil {
		return nil, screenResult{}, err
	}
	return doneResult(fmt.Sprintf("typed %d characters", len([]rune(a.Text))))
}

// keyNames are the modifiers' and keys' common names, as xdotool
// (X keysyms) spells them.
var keyNames = map[string]string{
	"ctrl": "ctrl", "control": "ctrl", "alt": "alt", "shift": "shift", "super": "super", "meta": "super", "cmd": "super", "win": "super",
	"enter": "Return", "return": "Return", "esc": "Escape", "escape": "Escape", "tab": "Tab", "space": "space",
	"backspace": "BackSpace", "delete": "Delete", "del": "Delete", "up": "Up", "down": "Down", "left": "Left", "right": "Right",
	"home": "Home", "end": "End", "pageup": "Page_Up", "pagedown": "Page_Down", "insert": "Insert",
}

func (s *Server) pressKeys(ctx context.Context, a keyArgs) (*sdk.CallToolResult, screenResult, error) {
	combo := strings.TrimSpace(a.Keys)
	if combo == "" {
		return nil, screenResult{}, fmt.Errorf("keys is empty: %w", errdefs.ErrInvalidArgument)
	}
	var parts []string
	for _, k := range strings.Split(combo, "+") {
		k = strings.TrimSpace(k)
		if k == "" || len(k) > 32 {
			return nil, screenResult{}, fmt.Errorf("keys %q: want keys joined with +, such as ctrl+s: %w", a.Keys, errdefs.ErrInvalidArgument)
		}
		for _, c := range k {
			if !(c == '_' || c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z') {
				return nil, screenResult{}, fmt.Errorf("key %q: want an X keysym name such as Return, F4 or a: %w", k, errdefs.ErrInvalidArgument)
			}
		}
		if n, ok := keyNames[strings.ToLower(k)]; ok {
			k = n
		}
		parts = append(parts, k)
	}
	if err := s.xdotool(ctx, a.SandboxID, "key", "--", strings.Join(parts, "+")); err != nil {
		return nil, screenResult{}, err
	}
	return doneResult("pressed " + strings.Join(parts, "+"))
}

func (s *Server) scroll(ctx context.Context, a scrollArgs) (*sdk.CallToolResult, screenResult, error) {
	button := map[string]string{"": "5", "down": "5", "up": "4", "left": "6", "right": "7"}[a.Direction]
	if button == "" {
		return nil, screenResult{}, fmt.Errorf("direction %q: want down, up, left or right: %w", a.Direction, errdefs.ErrInvalidArgument)
	}
	n := a.Amount
	if n == 0 {
		n = 3
	}
	if n < 0 || n > 50 {
		return nil, screenResult{}, fmt.Errorf("amount %d: want 1 to 50 steps: %w", a.Amount, errdefs.ErrInvalidArgument)
	}
	args, err := point(a.X, a.Y)
	if err != nil {
		return nil, screenResult{}, err
	}
	args = append(args, "click", "--repeat", strconv.Itoa(n), button)
	if err := s.xdotool(ctx, a.SandboxID, args...); err != nil {
		return nil, screenResult{}, err
	}
	return doneResult(fmt.Sprintf("scrolled %s %d steps", nonEmpty(a.Direction, "down"), n))
}

func (s *Server) openURL(ctx context.Context, a openURLArgs) (*sdk.CallToolResult, screenResult, error) {
	u, err := url.Parse(a.URL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, screenResult{}, fmt.Errorf("url %q: want an http or https URL: %w", a.URL, errdefs.ErrInvalidArgument)
	}
	if err := checkRef(a.SandboxID); err != nil {
		return nil, screenResult{}, err
	}
	// Checked first, so that a sandbox without a screen says so.
	if err := s.xdotool(ctx, a.SandboxID, "getmouselocation"); err != nil {
		return nil, screenResult{}, err
	}
	// In the background: the browser runs on after the call.
	if _, err := s.be.start(ctx, a.SandboxID, execSpec{
		Args: []string{"sh", "-c", `exec chromium --new-window "$1" >/tmp/hutch-open-url.log 2>&1`, "open_url", u.String()},
		Env:  map[string]string{"DISPLAY": screenDisplay},
	}); err != nil {
		return nil, screenResult{}, err
	}
	return doneResult("opened " + u.String() + " in Chromium; take a screenshot to see it")
}

func doneResult(what string) (*sdk.CallToolResult, screenResult, error) {
	return &sdk.CallToolResult{Content: []sdk.Content{&sdk.TextContent{Text: what}}}, screenResult{Done: what}, nil
}

func nonEmpty(s, def string) string {
	if s == "" {
		return def
	}
	return s
}
