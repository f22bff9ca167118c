package integration

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestServeConfigReload checks serve.toml end to end: the server takes
// its settings from the file, GET /version reports the build that
// `hutch version` prints, and a SIGHUP applies the live keys (a create
// that asks for no network then gets the new default), names the keys
// that need a restart and those a flag holds, and keeps every setting
// when the new file is bad.
func TestServeConfigReload(t *testing.T) {
	s := newServer(t, "")
	config := filepath.Join(t.TempDir(), "serve.toml")
	write := func(text string) {
		if err := os.WriteFile(config, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("default-network = \"none\"\naudit-log-keep = 3\nlisten = \"127.0.0.1:1\"\n")
	s.flags = []string{"--config", config}
	key := s.tenantAdd("cfg")
	s.serve()

	// GET /version is what `hutch version` says.
	r := s.do("GET", "/version", nil, map[string]string{"X-API-Key": key})
	var got, want map[string]string
	if r.status != http.StatusOK || json.Unmarshal([]byte(r.body), &got) != nil {
		t.Fatalf("GET /version: %s", r)
	}
	if err := json.Unmarshal([]byte(s.env.ok("version", "--format", "json")), &want); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"version", "commit", "buildDate", "goVersion", "runscVersion"} {
		if got[k] == "" || got[k] != want[k] {
			t.Errorf("GET /version %s = %q, hutch version says %q", k, got[k], want[k])
		}
	}
	if r := s.do("GET", "/version", nil, nil); r.status != http.StatusUnauthorized {
		t.Errorf("GET /version without a key: %s; want 401", r)
	}

	network := func() string {
		t.Helper()
		sb := s.createSandbox(key, "busybox")
		var info struct{ Network string }
		if err := json.Unmarshal([]byte(s.env.ok("inspect", "--format", "json", sb.SandboxID)), &info); err != nil {
			t.Fatal(err)
		}
		s.env.ok("rm", "-f", sb.SandboxID)
		return info.Network
	}
	if n := network(); n != "none" {
		t.Fatalf("default-network none in the file: a create got network %q", n)
	}

	write("default-network = \"open\"\nlog-level = \"debug\"\naudit-log-keep = 4\nlisten = \"127.0.0.1:2\"\n")
	line := s.hangup(t, "SIGHUP: reloaded the config file")
	if applied := strings.Join(asStrings(line["applied"]), " "); applied != "log-level=debug default-network=open" {
		t.Errorf("applied %q; want log-level=debug default-network=open", applied)
	}
	if rs := asStrings(line["need_restart"]); !slices.Equal(rs, []string{"audit-log-keep"}) {
		t.Errorf("need_restart %q; want audit-log-keep", rs)
	}
	if fl := asStrings(line["set_by_flag_or_env"]); !slices.Equal(fl, []string{"listen"}) {
		t.Errorf("set_by_flag_or_env %q; want listen (the test's --listen)", fl)
	}
	if n := network(); n != "open" {
		t.Fatalf("after SIGHUP with default-network open: a create got network %q", n)
	}

	// A bad file changes nothing, and says which key is at fault.
	write("default-network = \"none\"\ndefault-netwrok = \"none\"\n")
	line = s.hangup(t, "SIGHUP: the config file did not reload")
	if e, _ := line["error"].(string); !strings.Contains(e, `"default-netwrok"`) || !strings.Contains(e, config) {
		t.Errorf("the error of a bad file: %q; want it to name the file and the key", e)
	}
	if n := network(); n != "open" {
		t.Fatalf("after a bad file: a create got network %q, want the open in effect", n)
	}
	s.stopAndCheckClean()
}

// hangup sends the server SIGHUP and waits for the log line whose msg
// starts with msg, which it returns.
func (s *server) hangup(t *testing.T, msg string) map[string]any {
	t.Helper()
	before, _ := os.ReadFile(s.logPath)
	if err := s.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		b, _ := os.ReadFile(s.logPath)
		for _, l := range strings.Split(string(b[len(before):]), "\n") {
			var m map[string]any
			if json.Unmarshal([]byte(l), &m) == nil && strings.HasPrefix(fmt.Sprint(m["msg"]), msg) {
				return m
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("no log line %q within 10s of SIGHUP\nserver log:\n%s", msg, s.logTail(20))
	return nil
}

func asStrings(v any) []string {
	a, _ := v.([]any)
	out := make([]string, 0, len(a))
	for _, e := range a {
		s, _ := e.(string)
		out = append(out, s)
	}
	return out
}

// TestServeNotify checks the server's readiness protocol with systemd
// (Type=notify) against a NOTIFY_SOCKET of the test's own: READY=1 comes
// once the API answers, RELOADING=1 then READY=1 around a SIGHUP, and
// STOPPING=1 on SIGTERM.
func TestServeNotify(t *testing.T) {
	s := newServer(t, "")
	sock := filepath.Join(t.TempDir(), "notify")
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: sock, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	type message struct {
		text   string
		health int // GET /health's status at once after READY=1
	}
	msgs := make(chan message, 16)
	go func() {
		buf := make([]byte, 4096)
		for {
			n, err := conn.Read(buf)
			if err != nil {
				close(msgs)
				return
			}
			m := message{text: string(buf[:n])}
			if strings.Contains(m.text, "READY=1") {
				if resp, err := httpClient.Get(s.url("/health")); err == nil {
					m.health = resp.StatusCode
					resp.Body.Close()
				}
			}
			msgs <- m
		}
	}()
	next := func(want string) message {
		t.Helper()
		select {
		case m := <-msgs:
			if !strings.Contains(m.text, want) {
				t.Fatalf("notify message %q; want %s", m.text, want)
			}
			return m
		case <-time.After(30 * time.Second):
			t.Fatalf("no %s within 30s\nserver log:\n%s", want, s.logTail(20))
		}
		return message{}
	}
	s.env.extra = append(s.env.extra, "NOTIFY_SOCKET="+sock)
	s.serve()
	if m := next("READY=1"); m.health != http.StatusOK || !strings.Contains(m.text, "STATUS=serving on "+s.addr()) {
		t.Fatalf("READY=1 came with %q, GET /health then answered %d; want 200 and the address", m.text, m.health)
	}
	if err := s.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	next("RELOADING=1")
	if m := next("READY=1"); m.health != http.StatusOK {
		t.Fatalf("after a reload GET /health answered %d", m.health)
	}
	s.stop()
	next("STOPPING=1")
}
