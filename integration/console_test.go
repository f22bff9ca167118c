package integration

import (
	"context"
	"encoding/json"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/input"
	"github.com/chromedp/cdproto/log"
	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"

	"hutch.dev/hutch/integration/browser"
)

// The web console in a real Chromium against a real hutch serve with two
// tenants: sign in, create from the form, the terminal, files, charts,
// pause, resume, kill; the second tenant sees nothing of the first's;
// hostile metadata and file names run no script; a form of another site
// is refused.
func TestServeConsole(t *testing.T) {
	requiresRoot(t)
	s := newServer(t, "")
	archive := filepath.Join(binDir(t), "images", "code-interpreter-v1.tar")
	s.ok("image", "import", "code-interpreter-v1", archive)
	keyA := s.tenantAdd("alice", "--max-sandboxes", "10", "--max-cpus", "16", "--max-memory", "32g", "--max-snapshots", "20")
	keyB := s.tenantAdd("bob")
	operatorKeyFile := filepath.Join(t.TempDir(), "operator.key")
	s.flags = []string{"--operator-key-file", operatorKeyFile}
	s.serve()
	base := s.url("/console/")

	cb := openConsole(t, s, 4*time.Minute)
	b, ctx := cb.b, cb.ctx
	evalJS, waitJS, signIn := cb.eval, cb.wait, cb.signIn

	start := time.Now()
	signIn(keyA)
	hostile := `<img src=x onerror=alert(1)>`
	if err := chromedp.Do(ctx,
		chromedp.SetValue("#c-template", "code-interpreter-v1"),
		chromedp.SetValue("#c-lifetime", "600"),
		chromedp.SetValue("#c-metadata", "owner="+hostile),
		chromedp.Click("#c-submit"),
	); err != nil {
		t.Fatal(err)
	}
	id := waitJS("the created sandbox running in the list", `(() => { const r = document.querySelector('#sandboxes tr td.state-running'); return r ? r.parentElement.dataset.id : '' })()`, 90*time.Second)
	t.Logf("created %s from the form, running in the list after %s", id, time.Since(start).Round(time.Millisecond))
	if md := evalJS(`document.querySelector('#sandboxes tr[data-id="` + id + `"] td.metadata').textContent`); md != "owner="+hostile {
		t.Fatalf("metadata shown as %q", md)
	}
	if n := evalJS(`String(document.querySelectorAll('#sandboxes img').length)`); n != "0" {
		t.Fatalf("the metadata became %s img elements", n)
	}
	waitJS("CPU and memory now", `document.querySelector('#sandboxes tr[data-id="`+id+`"] td:nth-child(6)').textContent`, 15*time.Second)
	shot(t, ctx, "list.png")

	// The sandbox's page: terminal.
	if err := chromedp.Do(ctx, chromedp.Click(`#sandboxes a.sb-link`), chromedp.WaitVisible("#term .xterm")); err != nil {
		t.Fatal(err)
	}
	waitJS("the shell's prompt", `(() => { const t = document.querySelector('#term .xterm-rows').textContent; return /[$#]/.test(t) ? 'y' : '' })()`, 30*time.Second)
	// Typed as a user types: text input, then the Enter key.
	if err := chromedp.Do(ctx, chromedp.Focus("#term .xterm-helper-textarea")); err != nil {
		t.Fatal(err)
	}
	if _, err := chromedp.Call(ctx, input.InsertText, input.InsertTextParams{Text: "echo hi; python3 -c 'print(6*7)'"}); err != nil {
		t.Fatal(err)
	}
	if _, err := chromedp.Call(ctx, input.DispatchKeyEvent, input.DispatchKeyEventParams{Type: input.DispatchKeyEventTypeKeyDown, Key: "Enter", Code: "Enter", WindowsVirtualKeyCode: 13}); err != nil {
		t.Fatal(err)
	}
	waitJS("42 in the terminal", `[...document.querySelectorAll('#term .xterm-rows > div')].some(r => r.textContent.trim() === '42') ? 'y' : ''`, 30*time.Second)
	waitJS("hi in the terminal", `[...document.querySelectorAll('#term .xterm-rows > div')].some(r => r.textContent.trim() === 'hi') ? 'y' : ''`, 5*time.Second)
	shot(t, ctx, "terminal.png")

	// Upload a file with a hostile name, read it back through the API.
	name := `"><script>alert(2)<script>.txt`
	local := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(local, []byte("uploaded from the console\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := chromedp.Do(ctx, chromedp.SetValue("#f-dir", "/tmp"), chromedp.SetUploadFiles("#f-upload", []string{local})); err != nil {
		t.Fatal(err)
	}
	waitJS("the uploaded file in the list", `[...document.querySelectorAll('#files td.fname')].some(td => td.textContent === `+jsString(name)+`) ? 'y' : ''`, 20*time.Second)
	conn := s.do("POST", "/sandboxes/"+id+"/connect", strings.NewReader(`{}`), map[string]string{"X-API-Key": keyA, "Content-Type": "application/json"})
	var sb createdSandbox
	if err := json.Unmarshal([]byte(conn.body), &sb); err != nil || sb.EnvdAccessToken == "" {
		t.Fatalf("connect: %s", conn)
	}
	if r := s.do("GET", "/files?path="+url.QueryEscape("/tmp/"+name), nil, envdHeaders(keyA, sb)); r.status != 200 || r.body != "uploaded from the console\n" {
		t.Fatalf("reading the upload through the API: %s", r)
	}

	// Charts from the metrics history.
	waitJS("charts with points", `(() => { const c = [...document.querySelectorAll('#charts .chart')]; return c.length === 3 && c.every(d => Number(d.dataset.points) > 0 && d.querySelector('canvas')) ? 'y' : '' })()`, 30*time.Second)

	// Follow the log of a background process, whose lines include one
	// that is markup.
	s.ok("exec", "-d", id, "--", "sh", "-c", `for i in 1 2 3; do echo bg-line-$i; sleep 0.5; done; echo '<img src=x onerror=alert(3)>'`)
	waitJS("the background process's lines in the log", `(() => { const l = [...document.querySelectorAll('#logs .line')].map(d => d.textContent); return ['bg-line-1', 'bg-line-2', 'bg-line-3', '<img src=x onerror=alert(3)>'].every(x => l.some(t => t.endsWith(x))) ? 'y' : '' })()`, 30*time.Second)
	if n := evalJS(`String(document.querySelectorAll('#logs img').length)`); n != "0" {
		t.Fatalf("a log line became %s img elements", n)
	}

	// Snapshot, checkpoint and fork from the buttons; each is there
	// through the API.
	apiA := map[string]string{"X-API-Key": keyA}
	if err := chromedp.Do(ctx, chromedp.Click("#b-snapshot")); err != nil {
		t.Fatal(err)
	}
	snap := waitJS("the snapshot's ID", `(document.querySelector('#snapshot-id') || {}).textContent || ''`, 3*time.Minute)
	if r := s.do("GET", "/snapshots?sandboxID="+id, nil, apiA); !strings.Contains(r.body, `"`+snap+`"`) {
		t.Fatalf("snapshot %s from the button, not in GET /snapshots: %s", snap, r)
	}
	if err := chromedp.Do(ctx, chromedp.Click("#b-checkpoint")); err != nil {
		t.Fatal(err)
	}
	ck := waitJS("the checkpoint's ID", `(document.querySelector('#checkpoint-id') || {}).textContent || ''`, 2*time.Minute)
	waitJS("the checkpoint in the list", `document.querySelector('#checkpoints tr[data-checkpoint="`+ck+`"]') ? 'y' : ''`, 10*time.Second)
	if r := s.do("GET", "/sandboxes/"+id+"/checkpoints", nil, apiA); !strings.Contains(r.body, `"`+ck+`"`) {
		t.Fatalf("checkpoint %s from the button, not in the API's list: %s", ck, r)
	}
	if err := chromedp.Do(ctx, chromedp.Click("#b-fork")); err != nil {
		t.Fatal(err)
	}
	kid := waitJS("the fork's link", `(document.querySelector('#fork-link') || {}).textContent || ''`, 2*time.Minute)
	if r := s.do("GET", "/sandboxes/"+kid, nil, apiA); r.status != http.StatusOK || !strings.Contains(r.body, `"state":"running"`) {
		t.Fatalf("the fork %s from the button: %s", kid, r)
	}
	t.Logf("snapshot %s, checkpoint %s and fork %s from the buttons", snap, ck, kid)

	// Pause and resume from the buttons.
	if err := chromedp.Do(ctx, chromedp.Click("#b-pause")); err != nil {
		t.Fatal(err)
	}
	waitJS("paused", `document.querySelector('#sb-state').textContent === 'paused' ? 'y' : ''`, 60*time.Second)
	if err := chromedp.Do(ctx, chromedp.Click("#b-resume")); err != nil {
		t.Fatal(err)
	}
	waitJS("running again", `document.querySelector('#sb-state').textContent === 'running' ? 'y' : ''`, 60*time.Second)

	// A call of the console's page without the CSRF token, and a form
	// of another site.
	if got := evalJS(`fetch('/console/api/sandboxes', {method: 'POST', headers: {'Content-Type': 'application/json'}, body: '{"templateID":"code-interpreter-v1"}'}).then(r => String(r.status))`); got != "403" {
		t.Fatalf("a POST without the CSRF token answered %s, want 403", got)
	}

	// The second tenant sees none of the first's.
	b2 := browser.Start(t, browser.Options{Timeout: time.Minute})
	if err := chromedp.Do(b2.Context(), chromedp.Navigate(base), chromedp.WaitVisible("#apikey"), chromedp.SendKeys("#apikey", keyB), chromedp.Click("#signin-submit"), chromedp.WaitVisible("#sandboxes")); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2500 * time.Millisecond)
	if n, err := browser.Eval[string](b2, `String(document.querySelectorAll('#sandboxes tr').length) + document.querySelector('#error').textContent`); err != nil || n != "0" {
		t.Fatalf("bob's list: %q %v", n, err)
	}
	if r, err := browser.Eval[string](b2, `fetch('/console/api/sandboxes/`+id+`').then(r => String(r.status))`); err != nil || r != "404" {
		t.Fatalf("bob asking for alice's sandbox: %q %v", r, err)
	}

	// The operator's view: every tenant's use against its quota, and
	// every tenant's sandboxes; a tenant's key does not open it.
	opKey, err := os.ReadFile(operatorKeyFile)
	if err != nil {
		t.Fatal(err)
	}
	op := openConsole(t, s, time.Minute)
	if err := chromedp.Do(op.ctx, chromedp.Navigate(base), chromedp.WaitVisible("#apikey"), chromedp.SendKeys("#apikey", strings.TrimSpace(string(opKey))), chromedp.Click("#signin-submit"), chromedp.WaitVisible("#op-tenants")); err != nil {
		t.Fatalf("the operator's sign-in: %v", err)
	}
	op.wait("alice's two sandboxes of her ten in the operator's view", `(() => { const r = document.querySelector('#op-tenants tr[data-tenant="alice"] td.op-sandboxes'); return r && r.textContent === '2 / 10' ? 'y' : ''; })()`, 10*time.Second)
	if got := op.eval(`document.querySelector('#op-tenants tr[data-tenant="bob"] td.op-sandboxes').textContent`); got != "0" {
		t.Fatalf("bob's sandboxes in the operator's view: %q, want 0", got)
	}
	for _, sid := range []string{id, kid} {
		if got := op.eval(`(document.querySelector('#op-sandboxes tr[data-id="` + sid + `"] td.tenant') || {}).textContent || ''`); got != "alice" {
			t.Fatalf("sandbox %s in the operator's list: tenant %q, want alice", sid, got)
		}
	}
	if got := op.eval(`document.querySelector('#op-sandboxes tr[data-id="` + id + `"] td.metadata').textContent + '|' + document.querySelectorAll('#op-sandboxes img').length`); got != "owner="+hostile+"|0" {
		t.Fatalf("the hostile metadata in the operator's view: %q", got)
	}
	shot(t, op.ctx, "operator.png")
	if r := s.do("GET", "/operator/tenants", nil, apiA); r.status != http.StatusForbidden {
		t.Fatalf("a tenant's key on GET /operator/tenants: %s, want 403", r)
	}
	op.checkClean()

	// Kill, and it leaves the list.
	if err := chromedp.Do(ctx, chromedp.Click("#b-kill"), chromedp.WaitVisible("#sandboxes")); err != nil {
		t.Fatal(err)
	}
	waitJS("the killed sandbox gone from the list", `document.querySelector('#sandboxes tr[data-id="`+id+`"]') ? '' : 'y'`, 30*time.Second)

	before := len(s.sandboxIDs())
	seen := len(b.Responses())
	target := s.url("/console/api/sandboxes")
	b.Serve("http://attacker.test/", `<!doctype html><form method=post action="`+target+`" enctype="text/plain"><input name='{"templateID":"code-interpreter-v1","x":"' value='"}'></form><script>document.forms[0].submit()</script>`)
	if err := chromedp.Do(ctx, chromedp.Navigate("http://attacker.test/")); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second)
	refused := false
	for _, r := range b.Responses()[seen:] {
		if r.Method == "POST" && r.URL == target {
			if r.Status != http.StatusForbidden {
				t.Fatalf("the cross-site form POST answered %d, want 403", r.Status)
			}
			refused = true
		}
	}
	if !refused {
		t.Fatal("the cross-site form was not posted")
	}
	if after := len(s.sandboxIDs()); after != before {
		t.Fatalf("the cross-site form made a sandbox (%d -> %d)", before, after)
	}

	cb.checkClean()
	t.Logf("the whole console run took %s", time.Since(start).Round(time.Millisecond))
}

// consoleBrowser is a real Chromium on the console of server s, which
// notes anything a page's script should not have done.
type consoleBrowser struct {
	t   *testing.T
	s   *server
	b   *browser.Browser
	ctx context.Context
	mu  sync.Mutex
	bad []string
}

// openConsole starts the browser (attacker.test maps to loopback, for a
// page of another site) with a 1280x860 viewport.
func openConsole(t *testing.T, s *server, timeout time.Duration) *consoleBrowser {
	t.Helper()
	b := browser.Start(t, browser.Options{Timeout: timeout, HostRules: []string{"MAP attacker.test 127.0.0.1"}})
	cb := &consoleBrowser{t: t, s: s, b: b, ctx: b.Context()}
	ctx := cb.ctx
	if err := chromedp.Listen(ctx, func(ev any) {
		cb.mu.Lock()
		defer cb.mu.Unlock()
		switch ev := ev.(type) {
		case *page.EventJavascriptDialogOpening:
			cb.bad = append(cb.bad, "dialog: "+ev.Message)
			go chromedp.Call(ctx, page.HandleJavaScriptDialog, page.HandleJavaScriptDialogParams{}) //nolint:errcheck // best effort
		case *runtime.EventExceptionThrown:
			cb.bad = append(cb.bad, "exception: "+ev.ExceptionDetails.Text)
		case *runtime.EventConsoleAPICalled:
			if ev.Type == runtime.ConsoleAPICalledTypeError {
				cb.bad = append(cb.bad, "console.error")
			}
		case *log.EventEntryAdded:
			// A refused call logs a network error, which the tests ask
			// for; a blocked script is a security entry.
			if ev.Entry.Level == log.EntryLevelError && ev.Entry.Source != log.EntrySourceNetwork {
				cb.bad = append(cb.bad, "log: "+ev.Entry.Text)
			}
		}
	}); err != nil {
		t.Fatal(err)
	}
	for _, err := range []error{
		callErr(chromedp.Call(ctx, runtime.Enable, cdp.Empty{})),
		callErr(chromedp.Call(ctx, log.Enable, cdp.Empty{})),
		callErr(chromedp.Call(ctx, page.Enable, page.EnableParams{})),
		chromedp.Do(ctx, chromedp.EmulateViewport(1280, 860)),
	} {
		if err != nil {
			t.Fatal(err)
		}
	}
	return cb
}

// eval is js's value, a string.
func (cb *consoleBrowser) eval(js string) string {
	cb.t.Helper()
	v, err := browser.Eval[string](cb.b, js)
	if err != nil {
		cb.t.Fatalf("%s: %v", js, err)
	}
	return v
}

// wait evaluates js until it is a non-empty string, for at most d.
func (cb *consoleBrowser) wait(what, js string, d time.Duration) string {
	cb.t.Helper()
	deadline := time.Now().Add(d)
	for {
		v, err := browser.Eval[string](cb.b, js)
		if err == nil && v != "" {
			return v
		}
		if time.Now().After(deadline) {
			shotTo(cb.t, cb.ctx, filepath.Join(cb.t.TempDir(), "failed.png"))
			cb.t.Fatalf("waiting %s for %s: %v (last %q)\nserver log:\n%s", d, what, err, v, cb.s.logTail(20))
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// signIn signs in on the console with key.
func (cb *consoleBrowser) signIn(key string) {
	cb.t.Helper()
	if err := chromedp.Do(cb.ctx, chromedp.Navigate(cb.s.url("/console/")), chromedp.WaitVisible("#apikey"), chromedp.SendKeys("#apikey", key), chromedp.Click("#signin-submit"), chromedp.WaitVisible("#create")); err != nil {
		cb.t.Fatalf("sign in: %v", err)
	}
}

// checkClean fails the test on any CSP report the server had, and on
// any dialog, exception or console error of the pages.
func (cb *consoleBrowser) checkClean() {
	cb.t.Helper()
	r := cb.s.do("GET", "/console/csp-report", nil, nil)
	var rep struct{ Reports int }
	if err := json.Unmarshal([]byte(r.body), &rep); err != nil || rep.Reports != 0 {
		cb.t.Fatalf("CSP violation reports: %s", r)
	}
	cb.mu.Lock()
	defer cb.mu.Unlock()
	if len(cb.bad) > 0 {
		cb.t.Fatalf("the pages ran or logged what they should not have: %q", cb.bad)
	}
}

// shot saves a screenshot of the page to docs/console/NAME, for
// docs/console.md.
func shot(t *testing.T, ctx context.Context, name string) {
	t.Helper()
	shotTo(t, ctx, filepath.Join("..", "docs", "console", name))
}

// shotTo saves a screenshot of the page to file.
func shotTo(t *testing.T, ctx context.Context, file string) {
	t.Helper()
	png, err := chromedp.Run(ctx, chromedp.CaptureScreenshot())
	if err != nil {
		t.Logf("screenshot %s: %v", file, err)
		return
	}
	if err := os.MkdirAll(filepath.Dir(file), 0o755); err == nil {
		err = os.WriteFile(file, png, 0o644)
	}
	if err != nil {
		t.Logf("screenshot %s: %v", file, err)
		return
	}
	t.Logf("screenshot: %s", file)
}

func jsString(s string) string { b, _ := json.Marshal(s); return string(b) }

func callErr[T any](_ T, err error) error { return err }
