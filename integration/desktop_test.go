package integration

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"image"
	"image/png"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
)

// desktopDir holds the desktop SDK, Playwright and Puppeteer scripts and
// their pinned node_modules (make desktop-sdk).
const desktopDir = "desktop"

// requireDesktop fails unless the desktop image (make desktop-image) and
// the pinned @e2b/desktop SDK (make desktop-sdk) are there; it returns
// the image's archive.
func requireDesktop(t *testing.T) string {
	t.Helper()
	requireSDK(t)
	if _, err := os.Stat(filepath.Join(desktopDir, "node_modules", "@e2b", "desktop", "package.json")); err != nil {
		t.Fatalf("@e2b/desktop is not installed in integration/%s (run `make desktop-sdk`): %v", desktopDir, err)
	}
	archive := filepath.Join(binDir(t), "images", "desktop.tar")
	if _, err := os.Stat(archive); err != nil {
		t.Fatalf("the desktop image is not built (run `make desktop-image`): %v", err)
	}
	return archive
}

// sharedDesktop is the import of the desktop template into base's shared
// state root, with its checkpoint made by a first create, once per test
// process.
var sharedDesktop struct {
	once sync.Once
	err  error
}

// desktopRoot is base's shared state root with the desktop template in it.
func desktopRoot(t *testing.T) string {
	t.Helper()
	archive := requireDesktop(t)
	root := baseArchive(t)
	sharedDesktop.once.Do(func() {
		e := &env{t: t, bin: binDir(t), root: root}
		start := time.Now()
		if r := e.run(nil, "image", "import", "desktop", archive); r.code != 0 {
			sharedDesktop.err = fmt.Errorf("importing %s: %s", archive, r)
			return
		}
		imported := time.Since(start)
		// The first create after the import makes the template's
		// checkpoint: the X server and XFCE up.
		r := e.run(nil, "create", "--image", "desktop")
		if r.code != 0 {
			sharedDesktop.err = fmt.Errorf("the first sandbox of desktop: %s", r)
			return
		}
		e.run(nil, "rm", "-f", strings.TrimSpace(r.stdout))
		t.Logf("desktop imported in %s, its checkpoint made in %s", imported.Round(time.Millisecond), (time.Since(start) - imported).Round(time.Millisecond))
	})
	if sharedDesktop.err != nil {
		t.Fatal(sharedDesktop.err)
	}
	return root
}

// E2B's desktop SDK runs unchanged against hutch serve over TLS, set up
// with only E2B_API_KEY and E2B_DOMAIN: a create at 1280x800 from the
// warm template (made at the SDK's default 1024x768) gives 1280x800
// screenshots; the mouse, keyboard, launch, the editor, window queries
// and the noVNC stream with and without its key all work through the
// port routing; another tenant reaches none of it (desktop.mjs names
// each check). A second create at the default size is restored with its
// desktop already up.
func TestServeDesktop(t *testing.T) {
	requiresRoot(t)
	root := desktopRoot(t)
	s, key, other := serveOverTLS(t, root, "desk")

	extra := map[string]string{"HUTCH_OTHER_KEY": other, "NODE_OPTIONS": "--openssl-legacy-provider"}
	for _, res := range []string{"1280x800", "1024x768"} {
		t.Run(res, func(t *testing.T) {
			extra["HUTCH_RESOLUTION"] = res
			if res != "1280x800" {
				extra["HUTCH_DESKTOP_SCREEN_ONLY"] = "1"
			}
			id := s.runScriptIn(t, desktopDir, "desktop.mjs", key, extra, 10*time.Minute)
			if id == "" {
				t.Fatal("desktop.mjs made no sandbox")
			}
			t.Run("the sandbox was restored from the template's checkpoint", func(t *testing.T) {
				var r templateOf
				s.inspectInto(id, &r)
				if r.Template == nil || !r.Template.Warm {
					t.Fatalf("sandbox %s: template %+v, want restored warm", id, r.Template)
				}
			})
		})
	}
}

// `hutch browser ID` starts the sandbox's Chromium and serves its
// DevTools on the host with a token of its own: Playwright's
// connectOverCDP and Puppeteer's connect, from npm with no browser of
// their own, open a page served inside the sandbox through the one URL
// it prints, read its title, evaluate script and take screenshots. The
// sandbox's network policy holds for the browser: a host it allows
// loads, the same host on a port it does not allow and a host it never
// names (each a test host in the test's own network namespace) do not.
// The URL without its token opens nothing, and bad input exits 125.
func TestBrowserCDP(t *testing.T) {
	requiresRoot(t)
	e := newEnv(t)
	e.root = desktopRoot(t)
	w := newTestWorld(t)
	id := e.create("--image", "desktop", "--net", "allow", "--allow", w.testHost+":8080")
	t.Cleanup(func() { e.run(nil, "rm", "-f", id) })
	// A page served inside the sandbox, on its own 127.0.0.1.
	e.ok("exec", "-d", id, "--", "sh", "-c",
		`mkdir -p /tmp/www && printf '<!doctype html><title>hutch page</title><body data-answer="42">in the sandbox</body>' > /tmp/www/index.html && exec python3 -m http.server -d /tmp/www -b 127.0.0.1 8000`)

	for _, bad := range [][]string{{"browser"}, {"browser", id, "--display", "zero"}, {"browser", "no-such-sandbox"}} {
		if r := e.run(nil, bad...); r.code != 125 {
			t.Errorf("hutch %s: %s, want exit 125", strings.Join(bad, " "), r)
		}
	}

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := e.cmd(nil, "browser", id)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	stopped := false
	stop := func() error {
		if stopped {
			return nil
		}
		stopped = true
		cmd.Process.Signal(os.Interrupt)
		timer := time.AfterFunc(10*time.Second, func() { cmd.Process.Kill() })
		defer timer.Stop()
		return cmd.Wait()
	}
	t.Cleanup(func() { stop() })
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		stop()
		t.Fatalf("hutch browser printed no URL: %v\n%s", err, stderr.String())
	}
	cdpURL := strings.TrimSpace(line)
	t.Logf("hutch browser: %s after %s", cdpURL, time.Since(start).Round(time.Millisecond))
	if !strings.HasPrefix(cdpURL, "ws://127.0.0.1:") || !strings.Contains(cdpURL, "/devtools/browser?hutch_token=") {
		t.Fatalf("hutch browser printed %q, want ws://127.0.0.1:PORT/devtools/browser?hutch_token=TOKEN", cdpURL)
	}

	node := requireSDK(t)
	script := exec.CommandContext(ctx, node, filepath.Join(desktopDir, "cdp.mjs"))
	script.Env = append(os.Environ(), "HUTCH_NO_SERVE=1", "CDP_URL="+cdpURL,
		"PAGE_URL=http://127.0.0.1:8000/", "PAGE_TITLE=hutch page",
		"ALLOWED_URLS=http://"+w.testHost+":8080/",
		"DENIED_URLS=http://"+w.testHost+":80/ http://"+w.other+":80/ http://"+metadataIP+"/")
	runNodeChecks(t, ctx, script, "cdp.mjs", 5*time.Minute, func() string { return stderr.String() })

	t.Run("Chromium listens on the sandbox's 127.0.0.1 only", func(t *testing.T) {
		r := e.run(nil, "exec", id, "--", "sh", "-c", "cat /proc/net/tcp /proc/net/tcp6 2>/dev/null")
		// Port 9222 is 0x240E; 127.0.0.1 is 0100007F in /proc/net/tcp.
		for _, l := range strings.Split(r.stdout, "\n") {
			f := strings.Fields(l)
			if len(f) > 3 && strings.HasSuffix(f[1], ":240E") && f[3] == "0A" && !strings.HasPrefix(f[1], "0100007F:") {
				t.Errorf("something listens on %s, port 9222 beyond the sandbox's loopback: %s", f[1], l)
			}
		}
	})
	if err := stop(); err != nil {
		t.Errorf("hutch browser did not end cleanly on SIGINT: %v\n%s", err, stderr.String())
	}
}

// MCP's screen tools work a desktop sandbox as a computer-use model
// would through `hutch mcp`: screenshot returns a PNG image of the
// screen; click on the panel's terminal launcher, then type and key into
// the terminal, change what the next screenshot shows and run the typed
// command; scroll and open_url (a page served inside the sandbox) run;
// a sandbox without a screen, and bad arguments, are tool errors.
func TestMCPScreen(t *testing.T) {
	requiresRoot(t)
	e := newEnv(t)
	e.root = desktopRoot(t)
	cs := mcpServe(t, e)
	var sb mcpSandbox
	mustCall(t, cs, "create_sandbox", map[string]any{"image": "desktop"}, &sb)
	t.Cleanup(func() { e.run(nil, "rm", "-f", sb.SandboxID) })
	id := sb.SandboxID

	shot := func(t *testing.T) image.Image {
		t.Helper()
		var r struct{ Width, Height int }
		res := mustCall(t, cs, "screenshot", map[string]any{"sandbox_id": id}, &r)
		for _, c := range res.Content {
			if ic, ok := c.(*sdk.ImageContent); ok && ic.MIMEType == "image/png" {
				img, err := png.Decode(bytes.NewReader(ic.Data))
				if err != nil {
					t.Fatalf("the screenshot's PNG: %v", err)
				}
				if b := img.Bounds(); b.Dx() != r.Width || b.Dy() != r.Height {
					t.Fatalf("the screenshot is %v, its result says %dx%d", b, r.Width, r.Height)
				}
				return img
			}
		}
		t.Fatalf("screenshot returned no PNG image: %s", toolText(res))
		return nil
	}
	changed := func(a, b image.Image) int {
		n := 0
		r := a.Bounds()
		for y := r.Min.Y; y < r.Max.Y; y++ {
			for x := r.Min.X; x < r.Max.X; x++ {
				if a.At(x, y) != b.At(x, y) {
					n++
				}
			}
		}
		return n
	}
	before := shot(t)
	if b := before.Bounds(); b.Dx() != 1024 || b.Dy() != 768 {
		t.Fatalf("the desktop's screenshot is %v, want 1024x768", b)
	}

	t.Run("click, type and key change the screen and act", func(t *testing.T) {
		// The terminal's launcher on the panel (the second icon of the
		// dock at the bottom of XFCE's default layout).
		mustCall(t, cs, "click", map[string]any{"sandbox_id": id, "x": 440, "y": 744}, nil)
		var after image.Image
		waitFor(t, func() bool {
			after = shot(t)
			return changed(before, after) > 10000
		})
		t.Logf("%d pixels changed after the click", changed(before, after))
		waitFor(t, func() bool {
			r := e.run(nil, "exec", id, "--", "sh", "-c", "xdotool getwindowfocus getwindowname")
			return strings.Contains(r.stdout, "Terminal")
		})
		mustCall(t, cs, "type", map[string]any{"sandbox_id": id, "text": "echo typed by mcp > /tmp/mcp.txt"}, nil)
		mustCall(t, cs, "key", map[string]any{"sandbox_id": id, "keys": "Return"}, nil)
		waitFor(t, func() bool {
			r := e.run(nil, "exec", id, "--", "cat", "/tmp/mcp.txt")
			return r.stdout == "typed by mcp\n"
		})
		typed := shot(t)
		if changed(after, typed) == 0 {
			t.Error("typing into the terminal changed nothing on the screen")
		}
		mustCall(t, cs, "key", map[string]any{"sandbox_id": id, "keys": "ctrl+shift+w"}, nil)
		waitFor(t, func() bool {
			r := e.run(nil, "exec", id, "--", "sh", "-c", "xdotool search --onlyvisible --class xfce4-terminal || true")
			return strings.TrimSpace(r.stdout) == ""
		})
	})
	t.Run("scroll and a double right click run", func(t *testing.T) {
		mustCall(t, cs, "scroll", map[string]any{"sandbox_id": id, "direction": "up", "amount": 2, "x": 500, "y": 400}, nil)
		mustCall(t, cs, "click", map[string]any{"sandbox_id": id, "button": "right"}, nil)
		mustCall(t, cs, "key", map[string]any{"sandbox_id": id, "keys": "Escape"}, nil)
		r := e.run(nil, "exec", id, "--", "xdotool", "getmouselocation")
		if !strings.HasPrefix(r.stdout, "x:500 y:400") {
			t.Errorf("the pointer after scroll at 500, 400: %s", r)
		}
	})
	t.Run("open_url shows a page served inside the sandbox", func(t *testing.T) {
		e.ok("exec", "-d", id, "--", "sh", "-c",
			`mkdir -p /tmp/www && printf '<!doctype html><title>hutch mcp page</title><body style="background:#c00">red</body>' > /tmp/www/index.html && exec python3 -m http.server -d /tmp/www -b 127.0.0.1 8000`)
		waitFor(t, func() bool { return e.run(nil, "exec", id, "--", "curl", "-fsS", "http://127.0.0.1:8000/").code == 0 })
		mustCall(t, cs, "open_url", map[string]any{"sandbox_id": id, "url": "http://127.0.0.1:8000/"}, nil)
		waitFor(t, func() bool {
			r := e.run(nil, "exec", id, "--", "sh", "-c", "xdotool search --onlyvisible --name 'hutch mcp page' || true")
			return strings.TrimSpace(r.stdout) != ""
		})
	})
	t.Run("hutch record start and stop -o: an MP4 of the screen on the host", func(t *testing.T) {
		rec := strings.TrimSpace(e.ok("record", "start", "--fps", "15", id))
		e.ok("exec", id, "--", "xdotool", "mousemove", "--sync", "100", "100", "sleep", "0.5", "mousemove", "--sync", "600", "500", "sleep", "0.5")
		out := filepath.Join(t.TempDir(), "screen.mp4")
		e.ok("record", "stop", "-o", out, id, rec)
		b, err := os.ReadFile(out)
		if err != nil || len(b) < 2000 || string(b[4:8]) != "ftyp" {
			t.Fatalf("the recording %s: %v, %d bytes, want an MP4 (ftyp)", out, err, len(b))
		}
		// ffprobe, in the sandbox, of the file left there.
		info := e.ok("exec", id, "--", "ffprobe", "-v", "error", "-select_streams", "v:0", "-count_frames",
			"-show_entries", "stream=codec_name,width,height,nb_read_frames", "-of", "csv=p=0", "/tmp/hutch-recordings/"+rec+".mp4")
		f := strings.Split(strings.TrimSpace(info), ",")
		if len(f) != 4 || f[0] != "h264" || f[1] != "1024" || f[2] != "768" {
			t.Fatalf("ffprobe of the recording: %q, want h264, 1024x768", info)
		}
		if n, _ := strconv.Atoi(f[3]); n < 5 {
			t.Errorf("the recording has %s frames, want at least 5 of a second at 15 fps", f[3])
		}
		if r := e.run(nil, "record", "stop", id, rec); r.code != 125 || !strings.Contains(r.stderr, "no recording") {
			t.Errorf("a second stop: %s, want exit 125 naming no recording", r)
		}
		if r := e.run(nil, "record", "stop", id, "../../etc"); r.code != 125 {
			t.Errorf("a bad recording ID: %s, want exit 125", r)
		}
		if r := e.run(nil, "record", "start", "--fps", "0", id); r.code != 125 {
			t.Errorf("--fps 0: %s, want exit 125", r)
		}
	})
	t.Run("bad arguments and a sandbox without a screen are tool errors", func(t *testing.T) {
		var plain mcpSandbox
		mustCall(t, cs, "create_sandbox", map[string]any{"image": "base"}, &plain)
		t.Cleanup(func() { e.run(nil, "rm", "-f", plain.SandboxID) })
		for _, c := range []struct {
			tool string
			args map[string]any
			want string
		}{
			{"screenshot", map[string]any{"sandbox_id": plain.SandboxID}, "desktop"},
			{"click", map[string]any{"sandbox_id": id, "x": 10}, "x and y"},
			{"click", map[string]any{"sandbox_id": id, "button": "fourth"}, "button"},
			{"key", map[string]any{"sandbox_id": id, "keys": "ctrl+;rm"}, "key"},
			{"scroll", map[string]any{"sandbox_id": id, "amount": 500}, "amount"},
			{"open_url", map[string]any{"sandbox_id": id, "url": "file:///etc/passwd"}, "http"},
		} {
			res := callTool(t, cs, c.tool, c.args)
			if !res.IsError || !strings.Contains(toolText(res), c.want) {
				t.Errorf("%s %v: %v %q, want a tool error naming %q", c.tool, c.args, res.IsError, toolText(res), c.want)
			}
		}
	})
}
