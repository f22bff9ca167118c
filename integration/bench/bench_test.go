package main

import (
	"strings"
	"testing"
)

func TestSummarize(t *testing.T) {
	s := summarize([]float64{5, 1, 4, 2, 3, 6, 7, 8, 9, 10})
	if s.n != 10 || s.median != 5.5 || s.p90 != 9 || s.min != 1 {
		t.Errorf("summarize = %+v, want n 10, median 5.5, p90 9, min 1", s)
	}
	if s := summarize([]float64{3, 1, 2}); s.median != 2 || s.p90 != 3 {
		t.Errorf("summarize odd = %+v, want median 2, p90 3", s)
	}
}

func TestRunscFlags(t *testing.T) {
	var r rawSide
	r.root, r.dir = "/r", "/d"
	hutchFlags := []string{"--root=/s/runsc", "--overlay2=root:dir=/s/sandboxes/x,size=64", "--network=none", "--gofer-network-namespace=new"}
	if err := r.setGlobals(hutchFlags); err != nil {
		t.Fatal(err)
	}
	got := strings.Join(r.globals("c1"), " ")
	want := "--root=/r --overlay2=root:dir=/d/c1,size=64 --network=none --gofer-network-namespace=new"
	if got != want {
		t.Errorf("globals = %q, want %q", got, want)
	}
	if err := r.setGlobals([]string{"--network=none"}); err == nil {
		t.Error("flags without --root accepted")
	}
	if got := placeholders(hutchFlags, "R", "D"); got != "--root=R --overlay2=root:dir=D,size=64 --network=none --gofer-network-namespace=new" {
		t.Errorf("placeholders = %q", got)
	}
	if got := runscSubcommand([]string{"--root", "/x", "--network=none", "state", "id"}); got != "state" {
		t.Errorf("runscSubcommand = %q, want state", got)
	}
}

func TestKBField(t *testing.T) {
	status := []byte("Name:\thutch\nVmHWM:\t   9876 kB\nVmRSS:\t   1234 kB\n")
	if v, err := kBField(status, "VmRSS"); err != nil || v != 1234*1024 {
		t.Errorf("VmRSS = %d, %v", v, err)
	}
	if _, err := kBField(status, "Pss"); err == nil {
		t.Error("missing field found")
	}
}
