package buildimg

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"sync"

	"github.com/containerd/log"
	"golang.org/x/sys/unix"

	"hutch.dev/hutch/assembly"
	"hutch.dev/hutch/buildimg/ociworker"
	"hutch.dev/hutch/policy"
)

// netSocketName is the supervisor's socket in Dir where the runtime asks
// for its steps' networks.
const netSocketName = "net.sock"

// stepNetID is the assembly's ID of step id's network: its namespace is
// /var/run/netns/hutch-build-ID.
func stepNetID(id string) string { return "build-" + id }

// stepNets makes and removes the networks of a daemon's build steps, in
// the supervisor, which lives in the host's network namespace and
// outlives every step. Each step's network is a sandbox's in mode allow
// with the daemon's allow list, made by the assembly exactly as for a
// sandbox (assembly.SetupNetwork): a namespace and link, the firewall,
// the egress gateway for ports 80 and 443 and the DNS resolver, served in
// this process. Steps do not share a network: runsc's --network=sandbox
// takes the namespace's link for one sandbox.
type stepNets struct {
	// dir holds one directory per step network, named by the step's ID:
	// its resolv.conf, resolver configuration and egress log.
	dir   string
	allow []policy.AllowRule
	dns   []string

	// mu guards nets.
	mu   sync.Mutex
	nets map[string]*stepNet
}

// stepNet is one step's network, and the namespace held open: buildkitd
// and its steps live in a mount namespace of their own, made before the
// step's namespace was bind-mounted, so they reach it as this process's
// descriptor of it (/proc/PID/fd/N).
type stepNet struct {
	net   *assembly.Network
	netns *os.File
}

func (n *stepNet) answer(dir string) *ociworker.StepNetwork {
	return &ociworker.StepNetwork{
		Netns:      "/proc/" + strconv.Itoa(os.Getpid()) + "/fd/" + strconv.Itoa(int(n.netns.Fd())),
		ResolvConf: filepath.Join(dir, "resolv.conf"),
	}
}

// newStepNets checks the allow list and removes the networks a supervisor
// that died left behind.
func newStepNets(ctx context.Context, dir string, allow, dns []string) (*stepNets, error) {
	rules, err := policy.ParseAllowList(allow)
	if err != nil {
		return nil, fmt.Errorf("build allow list: %w", err)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	s := &stepNets{dir: dir, allow: rules, dns: dns, nets: map[string]*stepNet{}}
	s.teardownAll(ctx)
	return s, nil
}

// setup makes step id's network; a second call for the same step gives
// the same network.
func (s *stepNets) setup(ctx context.Context, id string) (*ociworker.StepNetwork, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	dir := filepath.Join(s.dir, id)
	if n, ok := s.nets[id]; ok {
		return n.answer(dir), nil
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	spec := assembly.NetworkSpec{
		ID: stepNetID(id), Dir: dir, Mode: policy.NetAllow, Allow: s.allow, DNS: s.dns, Gateway: true,
	}
	n, err := assembly.SetupNetwork(ctx, spec, assembly.ResolverInProcess{OnError: func(err error) {
		log.G(ctx).WithError(err).WithField("step", id).Warn("a build step's DNS resolver stopped")
	}})
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	f, err := os.Open(n.NetnsPath)
	if err != nil {
		assembly.TeardownNetwork(ctx, spec.ID, n.Resolver, false) //nolint:errcheck // the first error matters
		os.RemoveAll(dir)
		return nil, err
	}
	sn := &stepNet{net: n, netns: f}
	s.nets[id] = sn
	log.G(ctx).WithField("step", id).WithField("address", n.SandboxIP).Info("build step network up")
	return sn.answer(dir), nil
}

// teardown removes step id's network; it is idempotent.
func (s *stepNets) teardown(ctx context.Context, id string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.teardownLocked(ctx, id)
}

func (s *stepNets) teardownLocked(ctx context.Context, id string) error {
	var h *assembly.ResolverHandle
	if n, ok := s.nets[id]; ok {
		h = n.net.Resolver
		n.netns.Close()
	}
	if err := assembly.TeardownNetwork(ctx, stepNetID(id), h, false); err != nil {
		return err
	}
	delete(s.nets, id)
	return os.RemoveAll(filepath.Join(s.dir, id))
}

// teardownAll removes every step network there is, this supervisor's
// and those a dead one left. Failures are logged.
func (s *stepNets) teardownAll(ctx context.Context) {
	s.mu.Lock()
	defer s.mu.Unlock()
	ids := map[string]bool{}
	for id := range s.nets {
		ids[id] = true
	}
	entries, _ := os.ReadDir(s.dir)
	for _, e := range entries {
		if ociworker.ValidStepID(e.Name()) {
			ids[e.Name()] = true
		}
	}
	for id := range ids {
		if err := s.teardownLocked(ctx, id); err != nil {
			log.G(ctx).WithError(err).WithField("step", id).Warn("removing a build step's network")
		}
	}
}

// listen serves the runtime's requests on the socket at path until ctx
// ends.
func (s *stepNets) listen(ctx context.Context, path string) error {
	_ = os.Remove(path)
	l, err := listenUnix(path)
	if err != nil {
		return fmt.Errorf("listen for build steps' networks: %w", err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /steps/{id}", func(w http.ResponseWriter, r *http.Request) {
		id := r.PathValue("id")
		if !ociworker.ValidStepID(id) {
			http.Error(w, "bad step ID", http.StatusBadRequest)
			return
		}
		n, err := s.setup(context.WithoutCancel(ctx), id)
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		json.NewEncoder(w).Encode(n) //nolint:errcheck // the runtime sees a short answer
	})
	mux.HandleFunc("DELETE /steps/{id}", func(w http.ResponseWriter, r *http.Request) {
		id := r.PathValue("id")
		if !ociworker.ValidStepID(id) {
			http.Error(w, "bad step ID", http.StatusBadRequest)
			return
		}
		if err := s.teardown(context.WithoutCancel(ctx), id); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	})
	srv := &http.Server{Handler: mux}
	go func() {
		if err := srv.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.G(ctx).WithError(err).Warn("build steps' network socket")
		}
	}()
	go func() {
		<-ctx.Done()
		srv.Close()
	}()
	return nil
}

// listenUnix listens on the unix socket at path, however long: a path too
// long for a socket address is bound through /proc's name for its
// directory.
func listenUnix(path string) (net.Listener, error) {
	if len(path) < len(unix.RawSockaddrUnix{}.Path) {
		return net.Listen("unix", path)
	}
	fd, err := unix.Open(filepath.Dir(path), unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &os.PathError{Op: "listen", Path: path, Err: err}
	}
	defer unix.Close(fd)
	l, err := net.Listen("unix", "/proc/self/fd/"+strconv.Itoa(fd)+"/"+filepath.Base(path))
	if err != nil {
		return nil, err
	}
	l.(*net.UnixListener).SetUnlinkOnClose(false)
	return l, nil
}
