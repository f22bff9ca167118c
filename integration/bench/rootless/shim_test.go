package main

import (
	"math"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"
)

func TestShimLabel(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"runsc", []string{"--root=/r", "--network=none", "run", "--detach", "--bundle", "b", "id"}, "runsc run"},
		{"nsenter", []string{"--target=1", "--user", "--mount", "--", "/tmp/x/runsc", "--root=/r", "create"}, "nsenter → runsc"},
		{"nsenter", []string{"--target=1", "--user", "--", "unshare", "--net", "sleep", "infinity"}, "nsenter → unshare --net"},
		{"nsenter", []string{"--target=1", "--", "/tmp/x/hutch-helper", "resolver"}, "nsenter → hutch-helper"},
		{"sleep", []string{"infinity"}, "sleep infinity"},
		{"slirp4netns", []string{"--configure", "--mtu=65520"}, "slirp4netns --configure"},
	} {
		if got := shimLabel(tc.name, tc.args); got != tc.want {
			t.Errorf("shimLabel(%s, %q) = %q, want %q", tc.name, tc.args, got, tc.want)
		}
	}
}

func TestPhases(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	run := result{start: t0, exit: 100 * time.Millisecond}
	var p phases
	p.add(run, []shimCall{{at: at(10), label: "sleep infinity"}, {at: at(30), label: "nsenter → runsc"}, {at: at(35), label: "runsc run"}})
	p.add(run, []shimCall{{at: at(20), label: "sleep infinity"}, {at: at(40), label: "nsenter → runsc"}, {at: at(45), label: "runsc run"}})
	// Other calls: left out, counted.
	p.add(run, []shimCall{{at: at(20), label: "runsc run"}})

	if want := []string{"hutch starts and works until its first command below", "`sleep infinity`", "`nsenter → runsc`", "`runsc run`"}; !slices.Equal(p.names, want) {
		t.Fatalf("names %q, want %q", p.names, want)
	}
	if p.odd != 1 || p.firstRunsc != 2 {
		t.Fatalf("odd %d firstRunsc %d, want 1 and 2", p.odd, p.firstRunsc)
	}
	near := func(got, want float64) bool { return math.Abs(got-want) < 1e-9 }
	// Medians: start→sleep 15 ms, sleep→nsenter 20 ms, nsenter→runsc
	// 5 ms, runsc→exit 60 ms.
	for i, want := range []float64{0.015, 0.020, 0.005, 0.060} {
		if got := p.median(i); !near(got, want) {
			t.Errorf("phase %d median %v, want %v", i, got, want)
		}
	}
	if got := p.sum(0, p.firstRunsc); !near(got, 0.035) {
		t.Errorf("before runsc %v, want 0.035", got)
	}
	if p.find("slirp4netns") != -1 || p.find("sleep") != 1 {
		t.Errorf("find: %d %d", p.find("slirp4netns"), p.find("sleep"))
	}
}

func TestSummarize(t *testing.T) {
	v := make([]float64, 20)
	for i := range v {
		v[i] = float64(20 - i)
	}
	s := summarize(v)
	if s.n != 20 || s.median != 10.5 || s.p95 != 19 {
		t.Fatalf("summarize: %+v, want n 20, median 10.5, p95 19", s)
	}
}

// The calls of one process are one command, and commands keep the order
// hutch started them in, so that a process hutch does not wait for cannot
// change the order of the phases.
func TestReadCalls(t *testing.T) {
	log := filepath.Join(t.TempDir(), "calls.log")
	os.WriteFile(log, []byte(`2000 8 nsenter → unshare --net
2500 7 sleep infinity
2100 8 unshare --net
3000 9 nsenter → nft -f
3100 8 sleep infinity
4000 10 nsenter → runsc
4001 10 runsc create
`), 0o600)
	calls, err := readCalls(log)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, c := range calls {
		got = append(got, c.label)
	}
	want := []string{"sleep infinity", "nsenter → unshare --net … sleep infinity", "nsenter → nft -f", "nsenter → runsc … runsc create"}
	if !slices.Equal(got, want) {
		t.Fatalf("calls %q, want %q", got, want)
	}
	if calls[1].at.UnixNano() != 2000 {
		t.Fatalf("a command is timed from its first call: %d", calls[1].at.UnixNano())
	}
	// The holder noted its time after nsenter, started after it, had.
	if calls[0].at.UnixNano() != 2000 {
		t.Fatalf("the holder's time is %d, want nsenter's, 2000", calls[0].at.UnixNano())
	}
	var p phases
	p.add(result{start: time.Unix(0, 0), exit: 5000}, calls)
	if p.firstRunsc != 4 {
		t.Fatalf("firstRunsc %d, want 4 (the nsenter that runs runsc)", p.firstRunsc)
	}
}
