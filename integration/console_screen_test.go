package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/input"
	"github.com/chromedp/chromedp"
	"github.com/coder/websocket"
)

// The console shows a desktop sandbox's screen with noVNC, live and
// under the pointer, through its own origin; nobody gets the screen
// without the tenant's session from the console's own pages, or without
// the sandbox's stream token at serve's port routing.
func TestServeConsoleScreen(t *testing.T) {
	requiresRoot(t)
	s := newServer(t, desktopRoot(t))
	keyA := s.tenantAdd("carol")
	keyB := s.tenantAdd("dave")
	s.serve()
	id := s.createSandbox(keyA, "desktop").SandboxID
	apiA := map[string]string{"X-API-Key": keyA, "Content-Type": "application/json"}

	cb := openConsole(t, s, 3*time.Minute)
	ctx := cb.ctx
	cb.signIn(keyA)
	start := time.Now()
	if err := chromedp.Do(ctx, chromedp.Navigate(s.url("/console/sandbox/"+id)), chromedp.WaitVisible("#s-show"), chromedp.Click("#s-show")); err != nil {
		t.Fatal(err)
	}
	cb.wait("noVNC connected", `document.querySelector('#screen-status').textContent === 'connected' ? 'y' : ''`, 60*time.Second)
	// The canvas is the sandbox's screen, drawn: many colours (XFCE's
	// wallpaper and panel), not a blank frame.
	const sample = `(() => { const c = document.querySelector('#screen canvas'); if (!c || !c.width) return '';
	  const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data; const seen = new Set(); let h = 0;
	  for (let i = 0; i < d.length; i += 4 * 97) { const v = (d[i] << 16) | (d[i + 1] << 8) | d[i + 2]; seen.add(v); h = (h * 31 + v) >>> 0; }
	  return c.width + 'x' + c.height + ' ' + seen.size + ' ' + h; })()`
	var size string
	var colours int
	var before string
	cb.wait("the desktop drawn on the canvas", `(() => { const v = `+sample+`; return v && Number(v.split(' ')[1]) > 20 ? v : ''; })()`, 30*time.Second)
	if _, err := fmt.Sscanf(cb.eval(sample), "%s %d %s", &size, &colours, &before); err != nil {
		t.Fatal(err)
	}
	if size != "1024x768" {
		t.Fatalf("the canvas is %s, want the sandbox's 1024x768 screen", size)
	}
	t.Logf("screen shown in %s: %s, %d colours in the sample", time.Since(start).Round(time.Millisecond), size, colours)

	// The pointer: a move over the canvas moves the sandbox's pointer to
	// the screen's point under it (the canvas is scaled to fit).
	var rect struct{ X, Y, W, H float64 }
	if err := json.Unmarshal([]byte(cb.eval(`JSON.stringify((() => { const r = document.querySelector('#screen canvas').getBoundingClientRect(); return {X: r.left, Y: r.top, W: r.width, H: r.height}; })())`)), &rect); err != nil {
		t.Fatal(err)
	}
	for _, f := range [][2]float64{{0.5, 0.25}, {0.25, 0.75}} {
		x, y := rect.X+rect.W*f[0], rect.Y+rect.H*f[1]
		if _, err := chromedp.Call(ctx, input.DispatchMouseEvent, input.DispatchMouseEventParams{Type: input.DispatchMouseEventTypeMouseMoved, X: x, Y: y}); err != nil {
			t.Fatal(err)
		}
		wantX, wantY := int(1024*f[0]), int(768*f[1])
		loc := regexp.MustCompile(`x:(\d+) y:(\d+)`)
		var got string
		ok := false
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
			got = s.ok("exec", id, "--", "sh", "-c", "DISPLAY=:0 xdotool getmouselocation")
			if m := loc.FindStringSubmatch(got); m != nil {
				gx, _ := strconv.Atoi(m[1])
				gy, _ := strconv.Atoi(m[2])
				if abs(gx-wantX) <= 8 && abs(gy-wantY) <= 8 {
					ok = true
					break
				}
			}
		}
		if !ok {
			t.Fatalf("pointer moved to %.0f%%,%.0f%% of the canvas: the sandbox's pointer is at %q, want about %d,%d", f[0]*100, f[1]*100, strings.TrimSpace(got), wantX, wantY)
		}
	}
	// Live: a window opened in the sandbox appears on the canvas.
	s.ok("exec", "-d", id, "--", "sh", "-c", "DISPLAY=:0 exec xfce4-terminal --geometry 60x20+40+40")
	cb.wait("the canvas to change", `(() => { const v = `+sample+`; return v && v.split(' ')[2] !== `+jsString(before)+` ? 'y' : ''; })()`, 30*time.Second)
	time.Sleep(time.Second)
	if err := chromedp.Do(ctx, chromedp.ScrollIntoView("#screen")); err != nil {
		t.Fatal(err)
	}
	shot(t, ctx, "desktop.png")

	// The screen's WebSocket from a page of another site: no session
	// goes with it (SameSite=Strict), and it does not open.
	cb.b.Serve("http://attacker.test/", `<!doctype html><title>-</title><script>
const ws = new WebSocket('`+strings.Replace(s.url("/console/screen/"+id), "http", "ws", 1)+`');
ws.onopen = () => { document.title = 'opened'; }; ws.onerror = ws.onclose = () => { if (document.title !== 'opened') document.title = 'refused'; };
</script>`)
	if err := chromedp.Do(ctx, chromedp.Navigate("http://attacker.test/")); err != nil {
		t.Fatal(err)
	}
	if got := cb.wait("the other site's WebSocket to end", `document.title === '-' ? '' : document.title`, 10*time.Second); got != "refused" {
		t.Fatalf("a page of another site opening the console's screen WebSocket: %s", got)
	}

	// With the session's cookie but another Origin, the handshake is
	// refused too.
	r := s.do("POST", "/console/session", strings.NewReader(`{"apiKey":`+strconv.Quote(keyA)+`}`), map[string]string{"Content-Type": "application/json"})
	cookie := r.header.Get("Set-Cookie")
	if r.status != http.StatusOK || cookie == "" {
		t.Fatalf("console sign-in: %s", r)
	}
	cookie, _, _ = strings.Cut(cookie, ";")
	dial := func(origin string) (int, error) {
		dctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		c, resp, err := websocket.Dial(dctx, strings.Replace(s.url("/console/screen/"+id), "http", "ws", 1), &websocket.DialOptions{HTTPHeader: http.Header{"Cookie": {cookie}, "Origin": {origin}}})
		if err == nil {
			defer c.CloseNow()
			// The VNC server's greeting comes through the bridge.
			_, msg, err := c.Read(dctx)
			if err != nil || !strings.HasPrefix(string(msg), "RFB 003.") {
				return 0, fmt.Errorf("opened, but no RFB greeting: %q %v", msg, err)
			}
			return http.StatusSwitchingProtocols, nil
		}
		if resp != nil {
			return resp.StatusCode, nil
		}
		return 0, err
	}
	if code, err := dial("http://attacker.test"); err != nil || code != http.StatusForbidden {
		t.Fatalf("the screen's WebSocket with the session but Origin attacker.test: %d %v, want 403", code, err)
	}
	if code, err := dial(strings.TrimSuffix(s.url("/"), "/")); err != nil || code != http.StatusSwitchingProtocols {
		t.Fatalf("the screen's WebSocket with the session from the console's origin: %d %v, want it open with VNC's greeting", code, err)
	}

	// The VNC port at serve's port routing: not without the sandbox's
	// stream token, which only the tenant's key obtains.
	at := map[string]string{"E2b-Sandbox-Id": id, "E2b-Sandbox-Port": "5909"}
	if r := s.do("GET", "/", nil, at); r.status != http.StatusBadGateway {
		t.Fatalf("port 5909 without a token: %s, want 502 as for no sandbox", r)
	}
	if r := s.do("GET", "/?hutch_token=not-the-token", nil, at); r.status != http.StatusBadGateway {
		t.Fatalf("port 5909 with a wrong token: %s, want 502", r)
	}
	if r := s.do("POST", "/sandboxes/"+id+"/screen", strings.NewReader(`{}`), map[string]string{"X-API-Key": keyB, "Content-Type": "application/json"}); r.status != http.StatusNotFound {
		t.Fatalf("another tenant's POST /sandboxes/%s/screen: %s, want 404", id, r)
	}
	r = s.do("POST", "/sandboxes/"+id+"/screen", strings.NewReader(`{}`), apiA)
	var sc struct{ URL, Token string }
	if err := json.Unmarshal([]byte(r.body), &sc); r.status != http.StatusOK || err != nil || !strings.Contains(sc.URL, "5909-"+id+".") || sc.Token == "" {
		t.Fatalf("POST /sandboxes/%s/screen: %s", id, r)
	}
	if r := s.do("GET", "/?hutch_token="+sc.Token, nil, at); r.status != http.StatusBadRequest || !strings.Contains(r.body, "WebSocket") {
		t.Fatalf("port 5909 with the token, not as a WebSocket: %s, want 400 naming WebSocket", r)
	}
	if r := s.do("POST", "/sandboxes/"+id+"/screen", strings.NewReader(`{"display":"x;reboot"}`), apiA); r.status != http.StatusBadRequest || !strings.Contains(r.body, "display") {
		t.Fatalf("a bad display: %s, want 400 naming display", r)
	}
	plain := s.createSandbox(keyA, "base").SandboxID
	if r := s.do("POST", "/sandboxes/"+plain+"/screen", strings.NewReader(`{}`), apiA); r.status < 400 || r.status >= 500 || !strings.Contains(r.body, "desktop") {
		t.Fatalf("the screen of a base sandbox: %s, want a 4xx naming the desktop template", r)
	}
	cb.checkClean()
}

func abs(n int) int {
	if n < 0 {
		return -n
	}
	return n
}
