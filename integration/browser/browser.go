// Package browser drives a real headless Chromium (Debian's chromium,
// scripts/install-deps.sh) through the Chrome DevTools Protocol, over
// github.com/chromedp/chromedp, for the integration tests of what a web
// page can make a browser do to hutch: pages of an attacker's site, an
// operator console, a desktop stream.
//
// A Browser is one Chromium process with a profile of its own, ended with
// its test. It records the status of every HTTP response it receives, as
// the browser's network stack saw it (Responses), which a page's own
// script may not be allowed to read (CORS). Pages can be served from a
// name that resolves where the test says (Options.HostRules), and a
// document can be answered by the test itself (Serve), which is what a
// page looks like whose name first resolved to the attacker's server and
// then, for every later request, to the victim's: DNS rebinding.
package browser

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/fetch"
	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/chromedp"
)

// Options configure a Browser.
type Options struct {
	// HostRules are Chromium's --host-resolver-rules, e.g.
	// "MAP attacker.test 127.0.0.1": where names resolve, for this
	// browser only.
	HostRules []string
	// Timeout bounds everything the browser does; 0: 60 s.
	Timeout time.Duration
}

// Browser is one headless Chromium of a test.
type Browser struct {
	t   testing.TB
	ctx context.Context

	// mu guards responses, documents and methods (of the requests
	// sent, by ID).
	mu        sync.Mutex
	responses []Response
	documents map[string]string
	methods   map[network.RequestID]string
}

// Response is an HTTP response the browser received.
type Response struct {
	Method string
	URL    string
	Status int
}

// ExecPath is the Chromium the harness runs: $HUTCH_CHROMIUM, else
// chromium (Debian's) on $PATH.
func ExecPath() (string, error) {
	if p := os.Getenv("HUTCH_CHROMIUM"); p != "" {
		return p, nil
	}
	p, err := exec.LookPath("chromium")
	if err != nil {
		return "", fmt.Errorf("chromium is not installed (scripts/install-deps.sh installs Debian's chromium): %w", err)
	}
	return p, nil
}

// Start starts a headless Chromium for t, which fails if there is none.
// It ends when t does.
func Start(t testing.TB, opts Options) *Browser {
	t.Helper()
	path, err := ExecPath()
	if err != nil {
		t.Fatal(err)
	}
	if opts.Timeout == 0 {
		opts.Timeout = 60 * time.Second
	}
	flags := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(path),
		chromedp.UserDataDir(t.TempDir()),
		// Root has no user namespace sandbox for Chromium; the pages
		// are the test's own.
		chromedp.NoSandbox,
		chromedp.Flag("disable-dev-shm-usage", true),
		// No traffic beyond what the test asks for.
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-features", "Translate,OptimizationHints,MediaRouter,DialMediaRouteProvider,PrivateNetworkAccessSendPreflights,PrivateNetworkAccessRespectPreflightResults,LocalNetworkAccessChecks"),
	)
	if len(opts.HostRules) > 0 {
		flags = append(flags, chromedp.Flag("host-resolver-rules", strings.Join(opts.HostRules, ", ")))
	}
	ctx, cancelTimeout := context.WithTimeout(context.Background(), opts.Timeout)
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(ctx, flags...)
	ctx, cancel := chromedp.NewContext(allocCtx)
	b := &Browser{t: t, ctx: ctx, documents: map[string]string{}, methods: map[network.RequestID]string{}}
	t.Cleanup(func() {
		cancel()
		cancelAlloc()
		cancelTimeout()
	})
	if err := chromedp.Listen(ctx, b.event); err != nil {
		t.Fatalf("start chromium (%s): %v", path, err)
	}
	if _, err := chromedp.Call(ctx, network.Enable, network.EnableParams{}); err != nil {
		t.Fatalf("start chromium (%s): %v", path, err)
	}
	if _, err := chromedp.Call(ctx, fetch.Enable, fetch.EnableParams{Patterns: []*fetch.RequestPattern{{URLPattern: "*", RequestStage: fetch.RequestStageRequest}}}); err != nil {
		t.Fatalf("chromium: Fetch.enable: %v", err)
	}
	return b
}

// event records responses and answers the requests the browser pauses
// (every one, under fetch.Enable): with the document Serve gave for its
// URL, else by letting it go on to the network.
func (b *Browser) event(ev any) {
	switch ev := ev.(type) {
	case *network.EventRequestWillBeSent:
		b.mu.Lock()
		b.methods[ev.RequestID] = ev.Request.Method
		b.mu.Unlock()
	case *network.EventResponseReceived:
		b.mu.Lock()
		b.responses = append(b.responses, Response{Method: b.methods[ev.RequestID], URL: ev.Response.URL, Status: int(ev.Response.Status)})
		b.mu.Unlock()
	case *fetch.EventRequestPaused:
		b.mu.Lock()
		doc, ok := b.documents[ev.Request.URL]
		if ok {
			delete(b.documents, ev.Request.URL)
		}
		b.mu.Unlock()
		// Commands cannot be sent from the loop that reads events.
		go func() {
			// The browser may be gone at the end of the test.
			if ok {
				_, _ = chromedp.Call(b.ctx, fetch.FulfillRequest, fetch.FulfillRequestParams{
					RequestID: ev.RequestID, ResponseCode: 200, Body: []byte(doc),
					ResponseHeaders: []*fetch.HeaderEntry{{Name: "Content-Type", Value: "text/html; charset=utf-8"}},
				})
				return
			}
			_, _ = chromedp.Call(b.ctx, fetch.ContinueRequest, fetch.ContinueRequestParams{RequestID: ev.RequestID})
		}()
	}
}

// Serve makes the next request for url (a page's address) answer html,
// as if from whichever server url's name resolved to first; later
// requests for it, and every other request, reach the network.
func (b *Browser) Serve(url, html string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.documents[url] = html
}

// Open loads the page at url and waits for it to load.
func (b *Browser) Open(url string) error {
	return chromedp.Do(b.ctx, chromedp.Navigate(url))
}

// Eval runs script (an expression; a promise is awaited) in b's page and
// decodes its value as a T.
func Eval[T any](b *Browser, script string) (T, error) {
	return chromedp.Run(b.ctx, chromedp.Evaluate[T](script, chromedp.EvalAwaitPromise))
}

// Responses are the HTTP responses the browser has received so far, in
// order.
func (b *Browser) Responses() []Response {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]Response(nil), b.responses...)
}

// Context is the browser's page context, for chromedp actions a test
// runs itself (clicks, keys, screenshots, event listeners).
func (b *Browser) Context() context.Context { return b.ctx }
