package ociworker

import (
	"encoding/json"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// fakeSupervisor answers the runtime's requests as the supervisor does,
// recording them.
type fakeSupervisor struct {
	mu    sync.Mutex
	calls []string
}

func (f *fakeSupervisor) start(t *testing.T) string {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "net.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		f.calls = append(f.calls, r.Method+" "+r.URL.Path)
		f.mu.Unlock()
		if r.Method == http.MethodPost {
			json.NewEncoder(w).Encode(StepNetwork{Netns: "/var/run/netns/hutch-build-x", ResolvConf: "/steps/x/resolv.conf"})
			return
		}
		w.WriteHeader(http.StatusNoContent)
	})}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
	return sock
}

// bundle writes a step's bundle as BuildKit does: config.json (with a
// network namespace of its own if none is set) and a rootfs, with a CA
// bundle if withCA.
func bundle(t *testing.T, none, withCA bool) string {
	t.Helper()
	dir := t.TempDir()
	rootfs := filepath.Join(dir, "rootfs")
	if err := os.MkdirAll(filepath.Join(rootfs, "etc/ssl/certs"), 0o755); err != nil {
		t.Fatal(err)
	}
	if withCA {
		os.WriteFile(filepath.Join(rootfs, caBundle), []byte("image CAs\n"), 0o644)
	}
	s := specs.Spec{
		Root:    &specs.Root{Path: "rootfs"},
		Process: &specs.Process{Env: []string{"PATH=/bin"}},
		Mounts:  []specs.Mount{{Destination: "/etc/resolv.conf", Type: "bind", Source: "/buildkit/resolv.conf", Options: []string{"ro", "rbind"}}},
		Linux:   &specs.Linux{Namespaces: []specs.LinuxNamespace{{Type: specs.PIDNamespace}}},
	}
	if none {
		s.Linux.Namespaces = append(s.Linux.Namespaces, specs.LinuxNamespace{Type: specs.NetworkNamespace})
	}
	b, _ := json.Marshal(s)
	if err := os.WriteFile(filepath.Join(dir, "config.json"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

func readSpec(t *testing.T, dir string) specs.Spec {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	var s specs.Spec
	if err := json.Unmarshal(b, &s); err != nil {
		t.Fatal(err)
	}
	return s
}

// A step with BuildKit's default network gets the supervisor's: its
// namespace, resolv.conf and the host's CA bundle over the image's, and
// runsc's --network=sandbox; delete gives it back.
func TestStepNetwork(t *testing.T) {
	var f fakeSupervisor
	c := Config{Runsc: "/bin/runsc", Root: "/r", Net: f.start(t), CABundle: "/host/ca.crt"}
	dir := bundle(t, false, true)
	args, sub, id := c.Translate([]string{"run", "--bundle", dir, "--keep", "step1"})
	args, err := c.network(args, sub, id)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(args, "--network=sandbox") || slices.Contains(args, "--network=none") {
		t.Errorf("runsc args %q: want --network=sandbox", args)
	}
	s := readSpec(t, dir)
	if !slices.Contains(s.Linux.Namespaces, specs.LinuxNamespace{Type: specs.NetworkNamespace, Path: "/var/run/netns/hutch-build-x"}) {
		t.Errorf("namespaces %v: want the step's network", s.Linux.Namespaces)
	}
	var resolv, ca int
	for _, m := range s.Mounts {
		switch {
		case m.Destination == "/etc/resolv.conf" && m.Source == "/steps/x/resolv.conf":
			resolv++
		case m.Destination == caBundle && m.Source == "/host/ca.crt":
			ca++
		}
	}
	if resolv != 1 || ca != 1 || len(s.Mounts) != 2 {
		t.Errorf("mounts %+v: want the step's resolv.conf and the host's CA bundle", s.Mounts)
	}
	if env := strings.Join(s.Process.Env, " "); !strings.Contains(env, "SSL_CERT_FILE="+caBundle) || !strings.Contains(env, "PIP_CERT="+caBundle) {
		t.Errorf("env %q: want the CA variables", env)
	}

	args, sub, id = c.Translate([]string{"delete", "--force", "step1"})
	if _, err := c.network(args, sub, id); err != nil {
		t.Fatal(err)
	}
	if want := []string{"POST /steps/step1", "DELETE /steps/step1"}; !slices.Equal(f.calls, want) {
		t.Errorf("supervisor saw %q, want %q", f.calls, want)
	}
}

// RUN --network=none keeps none; an image without a CA bundle keeps its
// own trust (no mount point is made in its layer).
func TestStepNetworkNoneAndNoBundle(t *testing.T) {
	var f fakeSupervisor
	c := Config{Runsc: "/bin/runsc", Root: "/r", Net: f.start(t), CABundle: "/host/ca.crt"}
	dir := bundle(t, true, true)
	before, _ := os.ReadFile(filepath.Join(dir, "config.json"))
	args, sub, id := c.Translate([]string{"run", "--bundle", dir, "step2"})
	args, err := c.network(args, sub, id)
	if err != nil {
		t.Fatal(err)
	}
	after, _ := os.ReadFile(filepath.Join(dir, "config.json"))
	if !slices.Contains(args, "--network=none") || string(before) != string(after) || len(f.calls) != 0 {
		t.Errorf("a step that asked for no network was given one: %q, calls %q", args, f.calls)
	}

	dir = bundle(t, false, false)
	args, sub, id = c.Translate([]string{"create", "--bundle=" + dir, "step3"})
	if _, err := c.network(args, sub, id); err != nil {
		t.Fatal(err)
	}
	for _, m := range readSpec(t, dir).Mounts {
		if m.Destination == caBundle {
			t.Errorf("an image without a CA bundle got one mounted: %+v", m)
		}
	}
	if _, err := c.call(http.MethodPost, "../x"); err == nil {
		t.Error("a step ID with a slash was sent to the supervisor")
	}
}
