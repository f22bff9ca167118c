package browser

import (
	"fmt"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
)

// The harness itself: a page the test serves on one loopback address
// fetches from a name the browser resolves to another, and the test sees
// both responses' statuses as the browser got them.
func TestHarness(t *testing.T) {
	if os.Getenv("HUTCH_INTEGRATION") == "" {
		t.Skip("needs chromium: run through `make test` (HUTCH_INTEGRATION=1)")
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	var mu sync.Mutex
	var hosts []string
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		hosts = append(hosts, r.Host)
		mu.Unlock()
		w.Header().Set("Access-Control-Allow-Origin", "*")
		w.WriteHeader(http.StatusTeapot)
		fmt.Fprint(w, "from the server")
	})}
	go srv.Serve(l) //nolint:errcheck // closed at the end
	t.Cleanup(func() { srv.Close() })

	b := Start(t, Options{HostRules: []string{"MAP named.test 127.0.0.1"}})
	page := fmt.Sprintf("http://page.test:%d/", port)
	b.Serve(page, "<!doctype html><title>page</title>")
	if err := b.Open(page); err != nil {
		t.Fatal(err)
	}
	got, err := Eval[string](b, fmt.Sprintf(`fetch("http://named.test:%d/x").then(r => r.status + " " + r.headers.get("content-type") + " " + location.host)`, port))
	if err != nil {
		t.Fatal(err)
	}
	if want := fmt.Sprintf("418 text/plain; charset=utf-8 page.test:%d", port); got != want {
		t.Errorf("the page read %q, want %q", got, want)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(hosts) != 1 || hosts[0] != fmt.Sprintf("named.test:%d", port) {
		t.Errorf("the server saw Hosts %v, want only named.test (the page was served by the test)", hosts)
	}
	var seen []string
	for _, r := range b.Responses() {
		seen = append(seen, fmt.Sprintf("%s %s %d", r.Method, r.URL, r.Status))
	}
	if want := fmt.Sprintf("GET http://named.test:%d/x 418", port); !strings.Contains(strings.Join(seen, "\n"), want) {
		t.Errorf("responses %v, want one %q", seen, want)
	}
}
