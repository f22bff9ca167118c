package integration

import (
	"encoding/json"
	"net"
	"strings"
	"sync/atomic"
	"testing"
)

// A sandbox sending as fast as it can with --net-rate 8mbit gets about a
// megabyte a second through, whatever it tries; one without the limit,
// on the same path, gets far more: the limit, not the path, holds it.
// The limit comes back with a resume. Bad rates are refused by name.
func TestNetRateLimitsEgress(t *testing.T) {
	e := newEnv(t)
	w := newTestWorld(t)
	sink := w.listenInNetns("tcp", net.JoinHostPort(w.public, "9000")).(net.Listener)
	t.Cleanup(func() { sink.Close() })
	// got counts what arrives as it arrives: a sender's buffer still
	// draining after it is killed does not count.
	var got atomic.Int64
	go func() {
		for {
			c, err := sink.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				buf := make([]byte, 64<<10)
				for {
					n, err := c.Read(buf)
					got.Add(int64(n))
					if err != nil {
						return
					}
				}
			}()
		}
	}()
	// send runs a 3 s flood from sandbox id to the sink and returns what
	// arrived meanwhile.
	send := func(id string) int64 {
		t.Helper()
		got.Store(0)
		e.run(nil, "exec", id, "--", "sh", "-c", "timeout 3 nc "+w.public+" 9000 </dev/zero")
		return got.Load()
	}

	limited := e.create("--net", "open", "--net-rate", "8mbit")
	free := e.create("--net", "open")
	// 8 Mbit/s for 3 s is 3 MB; with the burst and a slow exec, under 6.
	const ceiling = 6 << 20
	if n := send(limited); n > ceiling || n == 0 {
		t.Errorf("with --net-rate 8mbit, 3 s of sending delivered %d bytes, want some and at most %d", n, ceiling)
	} else {
		t.Logf("with --net-rate 8mbit: %d bytes in 3 s", n)
	}
	if n := send(free); n <= ceiling {
		t.Fatalf("without --net-rate, 3 s of sending delivered only %d bytes: the path itself is too slow for the test", n)
	}
	var sb struct {
		NetRate int64 `json:"netRate"`
	}
	e.inspectInto(limited, &sb)
	if sb.NetRate != 8_000_000 {
		t.Errorf("inspect: netRate %d, want 8000000", sb.NetRate)
	}
	e.ok("pause", limited)
	e.ok("resume", limited)
	if n := send(limited); n > ceiling || n == 0 {
		t.Errorf("after a resume, with --net-rate 8mbit, 3 s of sending delivered %d bytes, want some and at most %d", n, ceiling)
	}

	for rate, want := range map[string]string{"fast": "rate", "1kbit": "64kbit"} {
		assertOneLineError(t, e.run(nil, "create", "--image", "busybox", "--net", "open", "--net-rate", rate), want)
	}
	assertOneLineError(t, e.run(nil, "create", "--image", "busybox", "--net-rate", "8mbit"), "no network")
	e.ok("rm", "-f", limited, free)
	e.assertClean(limited)
	e.assertClean(free)
	if out := e.ok("ls", "-q"); strings.TrimSpace(out) != "" {
		t.Errorf("refused creates left sandboxes: %s", out)
	}
}

// hutch serve --net-rate gives every sandbox with a network link the
// limit (one denied the internet keeps its link, for a later update),
// and none to one without a link.
func TestServeNetRate(t *testing.T) {
	requiresRoot(t)
	s := newServer(t, "")
	key := s.tenantAdd("rated")
	s.flags = []string{"--net-rate", "8mbit"}
	s.serve()
	h := map[string]string{"X-API-KEY": key, "Content-Type": "application/json"}
	for body, want := range map[string]int64{
		`{"templateID":"busybox","allow_internet_access":true}`:  8_000_000,
		`{"templateID":"busybox","allow_internet_access":false}`: 8_000_000,
		`{"templateID":"busybox"}`:                               0,
	} {
		r := s.do("POST", "/sandboxes", strings.NewReader(body), h)
		var c createdSandbox
		if r.status != 201 || json.Unmarshal([]byte(r.body), &c) != nil {
			t.Fatalf("POST /sandboxes %s: %s", body, r)
		}
		var sb struct {
			NetRate int64 `json:"netRate"`
		}
		s.env.inspectInto(c.SandboxID, &sb)
		if sb.NetRate != want {
			t.Errorf("%s: netRate %d, want %d", body, sb.NetRate, want)
		}
	}
	s.stop()
	bad := newServer(t, "")
	bad.flags = []string{"--net-rate", "fast"}
	if err := bad.start(); err == nil {
		t.Errorf("hutch serve --net-rate fast started")
	}
}
