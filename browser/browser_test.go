package browser

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// A stand-in for Chromium's DevTools HTTP side: it answers only a Host
// that is an IP address or localhost, as Chromium does.
func devtools(t *testing.T) (*httptest.Server, *[]string) {
	var seen []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen = append(seen, r.Method+" "+r.URL.RequestURI()+" host="+r.Host+" origin="+r.Header.Get("Origin"))
		if !strings.HasPrefix(r.Host, "127.0.0.1:") && !strings.HasPrefix(r.Host, "localhost:") {
			http.Error(w, "Host header is specified and is not an IP address or localhost.", http.StatusInternalServerError)
			return
		}
		switch r.URL.Path {
		case "/json/version", "/json/version/":
			io.WriteString(w, `{"Browser":"Chrome/156","webSocketDebuggerUrl":"ws://127.0.0.1:9222/devtools/browser/abc-123"}`)
		case "/json/list", "/json":
			io.WriteString(w, `[{"id":"P1","type":"page","webSocketDebuggerUrl":"ws://127.0.0.1:9222/devtools/page/P1","devtoolsFrontendUrl":"/devtools/inspector.html?ws=127.0.0.1:9222/devtools/page/P1"}]`)
		default:
			io.WriteString(w, "path "+r.URL.Path)
		}
	}))
	t.Cleanup(srv.Close)
	return srv, &seen
}

func proxyTo(srv *httptest.Server, token string) *Proxy {
	return &Proxy{
		Transport: DialTransport(func(ctx context.Context) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "tcp", srv.Listener.Addr().String())
		}),
		Token: token,
	}
}

func TestProxyRewritesHostAndURLs(t *testing.T) {
	srv, seen := devtools(t)
	front := httptest.NewServer(proxyTo(srv, "tok"))
	defer front.Close()
	req, _ := http.NewRequest("GET", front.URL+"/json/version?hutch_token=tok", nil)
	req.Host = "9222-sbx.hutch.example"
	req.Header.Set("Origin", "https://evil.example")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var v map[string]string
	json.NewDecoder(res.Body).Decode(&v)
	res.Body.Close()
	if got, want := v["webSocketDebuggerUrl"], "ws://9222-sbx.hutch.example/devtools/browser/abc-123?hutch_token=tok"; got != want {
		t.Errorf("webSocketDebuggerUrl %q, want %q", got, want)
	}
	if len(*seen) != 1 || !strings.Contains((*seen)[0], "host=127.0.0.1:9222") || strings.Contains((*seen)[0], "hutch_token") || strings.Contains((*seen)[0], "evil") {
		t.Errorf("Chromium saw %q: want Host 127.0.0.1:9222, no token, no Origin", *seen)
	}

	req, _ = http.NewRequest("GET", front.URL+"/json/list?hutch_token=tok", nil)
	req.Host = "9222-sbx.hutch.example"
	res, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var list []map[string]string
	json.NewDecoder(res.Body).Decode(&list)
	res.Body.Close()
	if len(list) != 1 || list[0]["webSocketDebuggerUrl"] != "ws://9222-sbx.hutch.example/devtools/page/P1?hutch_token=tok" ||
		!strings.Contains(list[0]["devtoolsFrontendUrl"], "ws=9222-sbx.hutch.example%2Fdevtools%2Fpage%2FP1%3Fhutch_token%3Dtok") {
		t.Errorf("/json/list rewritten to %v", list)
	}
}

func TestProxyStableBrowserPath(t *testing.T) {
	srv, seen := devtools(t)
	front := httptest.NewServer(proxyTo(srv, "tok"))
	defer front.Close()
	res, err := http.Get(front.URL + BrowserPath + "?hutch_token=tok")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if string(b) != "path /devtools/browser/abc-123" {
		t.Errorf("%s went to %q (seen %q), want the browser's own /devtools/browser/GUID", BrowserPath, b, *seen)
	}
}

func TestProxyBrowserDown(t *testing.T) {
	p := &Proxy{Transport: DialTransport(func(context.Context) (net.Conn, error) { return nil, &net.OpError{Op: "dial", Err: io.EOF} })}
	front := httptest.NewServer(p)
	defer front.Close()
	res, err := http.Get(front.URL + BrowserPath)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != http.StatusBadGateway || !strings.Contains(string(b), "does not answer on port 9222") {
		t.Errorf("a browser that is down: %d %q", res.StatusCode, b)
	}
}

func TestCheck(t *testing.T) {
	for _, c := range []struct {
		url, token string
		ok         bool
	}{
		{"/devtools/browser?hutch_token=abc", "abc", true},
		{"/devtools/browser?hutch_token=abd", "abc", false},
		{"/devtools/browser?hutch_token=ab", "abc", false},
		{"/devtools/browser", "abc", false},
		{"/devtools/browser?hutch_token=", "", false},
	} {
		r := httptest.NewRequest("GET", c.url, nil)
		if got := Check(r, c.token); got != c.ok {
			t.Errorf("Check(%s, %q) = %v, want %v", c.url, c.token, got, c.ok)
		}
	}
}

func TestValidDisplay(t *testing.T) {
	for d, ok := range map[string]bool{":0": true, ":10.1": true, "0": false, ":": false, ":a": false, ":0; rm -rf /": false} {
		if ValidDisplay(d) != ok {
			t.Errorf("ValidDisplay(%q) = %v", d, !ok)
		}
	}
}
