package hostnet

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/google/nftables"
	"github.com/miekg/dns"
	"golang.org/x/time/rate"

	"hutch.dev/hutch/egress"
	"hutch.dev/hutch/policy"
)

// ResolverConfig is the DNS resolver's configuration file. The engine
// replaces it when a sandbox's policy changes; the resolver notices before
// its next answer.
type ResolverConfig struct {
	// Listen is the host end of the sandbox's link, port 53.
	Listen string `json:"listen"`
	// Upstreams are the resolvers queries are forwarded to (ip:port).
	Upstreams []string `json:"upstreams"`
	// Mode is the sandbox's network mode.
	Mode  string             `json:"mode"`
	Allow []policy.AllowRule `json:"allow,omitempty"`
	// Table is the sandbox's nftables table, whose DNS sets receive the
	// addresses of allowed names.
	Table string `json:"table"`
	// Gateway, if set, is the sandbox's egress gateway, served by the
	// resolver's process under the same policy (package egress).
	Gateway *GatewayConfig `json:"gateway,omitempty"`
}

// GatewayConfig is where a sandbox's egress gateway listens and logs, and
// what it injects: its rules, the file of its CA (egress.NewCA) and the
// directory of the host's secret store, one file per secret.
type GatewayConfig struct {
	HTTP    string              `json:"http"`
	TLS     string              `json:"tls"`
	Log     string              `json:"log"`
	Inject  []policy.InjectRule `json:"inject,omitempty"`
	CA      string              `json:"ca,omitempty"`
	Secrets string              `json:"secrets,omitempty"`
}

// secret reads the secret name from the store dir.
func (g *GatewayConfig) secret(name string) (string, error) {
	if err := policy.CheckSecretName(name); err != nil {
		return "", err
	}
	b, err := os.ReadFile(filepath.Join(g.Secrets, name))
	if err != nil {
		return "", fmt.Errorf("secret %s: not in the host's store", name)
	}
	return string(b), nil
}

// WriteResolverConfig writes c to path atomically.
func WriteResolverConfig(path string, c ResolverConfig) error {
	b, err := json.MarshalIndent(c, "", "  ")
	if err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// ReadResolverConfig reads the file WriteResolverConfig wrote.
func ReadResolverConfig(path string) (*ResolverConfig, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var c ResolverConfig
	if err := json.Unmarshal(b, &c); err != nil {
		return nil, fmt.Errorf("resolver config %s: %w", path, err)
	}
	return &c, nil
}

// HostUpstreams are the host's nameservers from /etc/resolv.conf.
func HostUpstreams() []string {
	cc, err := dns.ClientConfigFromFile("/etc/resolv.conf")
	if err != nil {
		return nil
	}
	var out []string
	for _, s := range cc.Servers {
		out = append(out, net.JoinHostPort(s, cc.Port))
	}
	return out
}

// minAdmit is the shortest time an answered address stays admitted, so a
// connect right after a TTL-0 answer still passes; maxAdmit the longest,
// whatever TTL the answer carries, so that a long TTL neither keeps an
// address open for years nor exceeds what nftables accepts.
const (
	minAdmit = 2 * time.Second
	maxAdmit = time.Hour
)

// A sandbox's queries cost the host a goroutine, a socket to the upstream
// and a netlink message each; the resolver runs outside the sandbox, so
// it bounds them itself. maxInFlight queries are served at once (more are
// dropped, as a busy server does: the client retries), and at most
// queryRate a second on average, in bursts of queryBurst (more are
// refused at once, without asking upstream).
const (
	maxInFlight = 32
	queryRate   = 200
	queryBurst  = 400
)

type resolver struct {
	path string
	// mu guards cfg and stamp: the config as last read, and the file's
	// identity when it was read.
	mu    sync.Mutex
	cfg   *ResolverConfig
	stamp fileStamp
	// slots bounds the queries in flight, limit their rate.
	slots chan struct{}
	limit *rate.Limiter
	// nft admits answered addresses over netlink.
	nft *nftables.Conn
}

type fileStamp struct {
	ino   uint64
	mtime time.Time
	size  int64
}

func stampOf(path string) (fileStamp, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return fileStamp{}, err
	}
	st, _ := fi.Sys().(*syscall.Stat_t)
	var ino uint64
	if st != nil {
		ino = st.Ino
	}
	return fileStamp{ino: ino, mtime: fi.ModTime(), size: fi.Size()}, nil
}

func newResolver(cfgPath string) *resolver {
	return &resolver{path: cfgPath, slots: make(chan struct{}, maxInFlight), limit: rate.NewLimiter(queryRate, queryBurst)}
}

// current returns the policy in force: the file is re-read whenever it was
// replaced (WriteResolverConfig renames, so the inode changes).
func (r *resolver) current() *ResolverConfig {
	r.mu.Lock()
	defer r.mu.Unlock()
	if st, err := stampOf(r.path); err == nil && st != r.stamp {
		if c, err := ReadResolverConfig(r.path); err == nil {
			r.cfg, r.stamp = c, st
		} else {
			logf("reload: %v\n", err)
		}
	}
	return r.cfg
}

// logMax bounds the resolver's log (its stderr: a file beside the
// sandbox's state, or the shim's log): how often it has something to
// report is the sandbox's choice.
const logMax = 1 << 20

var (
	logMu   sync.Mutex
	logOut  io.Writer = os.Stderr
	logLeft int64     = -1 // -1: not yet known; 0: full
)

// logf writes a line to the resolver's log while the log holds less than
// logMax bytes (counting what an earlier resolver of the sandbox wrote),
// and one last line saying so when it is full.
func logf(format string, args ...any) {
	logMu.Lock()
	defer logMu.Unlock()
	if logLeft < 0 {
		logLeft = logMax
		if f, ok := logOut.(*os.File); ok {
			if fi, err := f.Stat(); err == nil && fi.Mode().IsRegular() {
				logLeft = max(0, logMax-fi.Size())
			}
		}
	}
	if logLeft == 0 {
		return
	}
	const full = "resolver: log full, further lines dropped\n"
	line := fmt.Sprintf(format, args...)
	if int64(len(line)+len(full)) > logLeft {
		fits := int64(len(full)) <= logLeft
		line, logLeft = full, 0
		if !fits {
			return
		}
	} else {
		logLeft -= int64(len(line))
	}
	io.WriteString(logOut, line) //nolint:errcheck // best effort
}

// ServeResolver runs the resolver described by the file at cfgPath until
// ctx ends, following changes to the file. ready, if non-nil, receives nil
// once it listens, or the error that stopped it from listening.
func ServeResolver(ctx context.Context, cfgPath string, ready func(error)) (err error) {
	if ready == nil {
		ready = func(error) {}
	}
	r := newResolver(cfgPath)
	c := r.current()
	if c == nil {
		err := fmt.Errorf("resolver config %s unreadable", cfgPath)
		ready(err)
		return err
	}

	if r.nft, err = nftables.New(); err != nil {
		err = fmt.Errorf("netlink for nftables: %w", err)
		ready(err)
		return err
	}
	udp, err := net.ListenPacket("udp4", c.Listen)
	if err != nil {
		ready(err)
		return err
	}
	tcp, err := net.Listen("tcp4", c.Listen)
	if err != nil {
		udp.Close()
		ready(err)
		return err
	}
	servers := []*dns.Server{
		{PacketConn: udp, Handler: r},
		{Listener: tcp, Handler: r},
	}
	var gw *egress.Gateway
	if g := c.Gateway; g != nil {
		gw, err = egress.Listen(egress.Config{
			HTTP: g.HTTP, TLS: g.TLS, Log: g.Log, Policy: r.webPolicy,
			Inject: g.Inject, CA: g.CA, Secret: g.secret,
		})
		if err != nil {
			udp.Close()
			tcp.Close()
			ready(err)
			return err
		}
	}
	errc := make(chan error, len(servers)+1)
	for _, s := range servers {
		go func(s *dns.Server) { errc <- s.ActivateAndServe() }(s)
	}
	gwCtx, stopGateway := context.WithCancel(ctx)
	defer stopGateway()
	if gw != nil {
		go func() { errc <- gw.Serve(gwCtx) }()
	}
	ready(nil)
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
		for _, s := range servers {
			s.Shutdown() //nolint:errcheck // exiting
		}
		return nil
	}
}

// webPolicy is the gateway's view of the policy in force.
func (r *resolver) webPolicy() *egress.Policy {
	c := r.current()
	if c == nil {
		return nil
	}
	return &egress.Policy{Mode: c.Mode, Allow: c.Allow, Upstreams: c.Upstreams}
}

// ServeDNS answers one query under the current policy, within the
// resolver's bounds.
func (r *resolver) ServeDNS(w dns.ResponseWriter, q *dns.Msg) {
	select {
	case r.slots <- struct{}{}:
		defer func() { <-r.slots }()
	default:
		return // dropped: too many in flight
	}
	if !r.limit.Allow() {
		m := new(dns.Msg)
		m.SetRcode(q, dns.RcodeRefused)
		w.WriteMsg(m) //nolint:errcheck // client may be gone
		return
	}
	w.WriteMsg(r.answer(q, w.RemoteAddr().Network())) //nolint:errcheck // client may be gone
}

// answer is the reply to q under the policy in force.
func (r *resolver) answer(q *dns.Msg, network string) *dns.Msg {
	reply := func(rcode int) *dns.Msg {
		m := new(dns.Msg)
		m.SetRcode(q, rcode)
		return m
	}
	if q.Opcode != dns.OpcodeQuery {
		return reply(dns.RcodeNotImplemented)
	}
	if len(q.Question) != 1 {
		return reply(dns.RcodeFormatError)
	}
	question := q.Question[0]
	switch {
	case question.Qclass != dns.ClassINET:
		// CHAOS and friends reveal the upstream's identity; only the
		// Internet class names what a sandbox connects to.
		return reply(dns.RcodeRefused)
	case question.Qtype == dns.TypeAXFR || question.Qtype == dns.TypeIXFR:
		return reply(dns.RcodeRefused)
	}
	c := r.current()
	if rcode, ok := refusal(c, question); !ok {
		return reply(rcode)
	}
	resp, err := forward(q, c.Upstreams, network)
	if err != nil {
		return reply(dns.RcodeServerFailure)
	}
	if rcode, err := r.admit(question, resp); err != nil {
		logf("admit %s: %v\n", question.Name, err)
		return reply(rcode)
	}
	resp.Id = q.Id
	return resp
}

// refusal says whether the policy c answers the question at all, and if
// not, with which code.
func refusal(c *ResolverConfig, question dns.Question) (int, bool) {
	switch {
	case c.Mode == policy.NetNone:
		return dns.RcodeRefused, false
	case c.Mode == policy.NetAllow && len(matching(c.Allow, question.Name)) == 0:
		// A name the policy does not allow does not exist for the
		// sandbox.
		return dns.RcodeNameError, false
	case question.Qtype == dns.TypeAAAA:
		// Sandboxes have no IPv6: an empty answer makes clients use
		// IPv4 at once.
		return dns.RcodeSuccess, false
	}
	return 0, true
}

// matching are the rules of all that name matches.
func matching(all []policy.AllowRule, name string) []policy.AllowRule {
	var rules []policy.AllowRule
	for _, rule := range all {
		if rule.MatchName(name) {
			rules = append(rules, rule)
		}
	}
	return rules
}

// admit lets the sandbox reach the addresses of resp, an answer to
// question, if the policy in force now (not when the query came: an
// update may have revoked the name meanwhile) allows the name. It holds
// the policy's lock, which an update holds while it replaces policy and
// firewall, so an address is admitted under the policy that the
// firewall it goes into was made from. On refusal it returns the code to
// answer with.
func (r *resolver) admit(question dns.Question, resp *dns.Msg) (int, error) {
	unlock, err := lockPolicy(r.path)
	if err != nil {
		return dns.RcodeServerFailure, err
	}
	defer unlock()
	c := r.current()
	if rcode, ok := refusal(c, question); !ok {
		return rcode, fmt.Errorf("no longer allowed")
	}
	rules := matching(c.Allow, question.Name)
	if len(rules) == 0 {
		return 0, nil // open mode: the firewall decides by address
	}
	if err := admitNetlink(r.nft, c.Table, rules, c.Allow, resp); err != nil {
		return dns.RcodeServerFailure, err
	}
	return 0, nil
}

// lockPolicy takes the lock that orders a sandbox's policy updates and
// the resolver's admissions: a file beside the resolver's configuration.
func lockPolicy(cfgPath string) (func(), error) {
	f, err := os.OpenFile(cfgPath+".lock", os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		f.Close()
		return nil, err
	}
	return func() { f.Close() }, nil
}

// UpdatePolicy replaces a sandbox's policy: the resolver's configuration
// at cfgPath, and through apply the firewall, under the lock the resolver
// admits under, so that no answer to a query the old policy allowed is
// admitted into the new firewall. If apply fails, the old configuration
// is put back.
func UpdatePolicy(cfgPath string, c ResolverConfig, apply func() error) error {
	unlock, err := lockPolicy(cfgPath)
	if err != nil {
		return err
	}
	defer unlock()
	old, err := ReadResolverConfig(cfgPath)
	if err != nil {
		return err
	}
	if err := WriteResolverConfig(cfgPath, c); err != nil {
		return err
	}
	if err := apply(); err != nil {
		return errors.Join(err, WriteResolverConfig(cfgPath, *old))
	}
	return nil
}

// forward asks the upstreams in turn, over TCP when UDP truncates.
func forward(q *dns.Msg, upstreams []string, network string) (*dns.Msg, error) {
	if len(upstreams) == 0 {
		return nil, errors.New("no upstream resolvers")
	}
	var lastErr error
	for _, up := range upstreams {
		cl := &dns.Client{Net: "udp", Timeout: 3 * time.Second}
		if network == "tcp" {
			cl.Net = "tcp"
		}
		resp, _, err := cl.Exchange(q, up)
		if err == nil && resp.Truncated && cl.Net == "udp" {
			cl.Net = "tcp"
			resp, _, err = cl.Exchange(q, up)
		}
		if err == nil {
			return resp, nil
		}
		lastErr = err
	}
	return nil, lastErr
}

// admitTTL is how long an answer with the given TTL keeps its address
// admitted: the TTL bounded to [minAdmit, maxAdmit].
func admitTTL(ttl uint32) time.Duration {
	return min(max(time.Duration(ttl)*time.Second, minAdmit), maxAdmit)
}

// admitAddrs are the answer's IPv4 addresses a DNS answer may admit:
// denied ones only where an address rule of all names them (and then the
// firewall admits them anyway), so that an allowed name answering
// 169.254.169.254 or 10.0.0.1 opens nothing.
func admitAddrs(all []policy.AllowRule, resp *dns.Msg) []*dns.A {
	var out []*dns.A
	for _, rr := range resp.Answer {
		a, ok := rr.(*dns.A)
		if !ok {
			continue
		}
		addr, ok := netip.AddrFromSlice(a.A)
		if !ok {
			continue
		}
		addr = addr.Unmap()
		if !addr.Is4() || policy.Denied(addr) && !policy.AllowsAddr(all, addr) {
			logf("not admitting %s for %s: a denied address\n", addr, a.Hdr.Name)
			continue
		}
		out = append(out, a)
	}
	return out
}

// admitNetlink adds the answer's IPv4 addresses to the sandbox's DNS sets
// for the records' TTL (bounded by admitTTL), before the answer reaches
// the sandbox, in one netlink transaction. all is every rule of the
// policy, rules those the name matched.
func admitNetlink(c *nftables.Conn, table string, rules, all []policy.AllowRule, resp *dns.Msg) error {
	var anyPort, port []nftables.SetElement
	for _, a := range admitAddrs(all, resp) {
		ip := a.A.To4()
		ttl := admitTTL(a.Hdr.Ttl)
		for _, rule := range rules {
			if rule.Port == 0 {
				anyPort = append(anyPort, nftables.SetElement{Key: ip, Timeout: ttl})
			} else {
				// ipv4_addr . inet_service: each field takes a 4-byte
				// register, the port big-endian and padded.
				key := append(append([]byte{}, ip...), byte(rule.Port>>8), byte(rule.Port), 0, 0)
				port = append(port, nftables.SetElement{Key: key, Timeout: ttl})
			}
		}
	}
	if len(anyPort) == 0 && len(port) == 0 {
		return nil
	}
	t := &nftables.Table{Name: table, Family: nftables.TableFamilyINet}
	for _, add := range []struct {
		set   string
		elems []nftables.SetElement
	}{{policy.DNSSetAny, anyPort}, {policy.DNSSetPort, port}} {
		if len(add.elems) == 0 {
			continue
		}
		set, err := c.GetSetByName(t, add.set)
		if err != nil {
			return fmt.Errorf("set %s of table %s: %w", add.set, table, err)
		}
		if err := c.SetAddElements(set, add.elems); err != nil {
			return err
		}
	}
	return c.Flush()
}

// HelperName is the small binary beside hutch that serves the resolver
// with the same arguments as hutch (cmd/hutch-helper): it links little
// besides this package, so an idle resolver holds a small part of an
// idle hutch's memory. (docs/decisions/0026-sandbox-helpers.md)
const HelperName = "hutch-helper"

// StartResolver starts `exe args...` (a hutch binary whose args make it call
// ServeResolver) as a detached process with its output appended to
// logPath, and waits until it listens. It returns the process's PID. If
// exe is hutch and HelperName is beside it, HelperName runs the resolver
// instead, with args.
func StartResolver(exe string, args []string, logPath string) (int, error) {
	exe = helperFor(exe)
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return 0, err
	}
	defer logFile.Close()
	rd, wr, err := os.Pipe()
	if err != nil {
		return 0, err
	}
	defer rd.Close()
	cmd := exec.Command(exe, args...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.ExtraFiles = []*os.File{wr}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		wr.Close()
		return 0, fmt.Errorf("start DNS resolver: %w", err)
	}
	wr.Close()
	rd.SetReadDeadline(time.Now().Add(10 * time.Second)) //nolint:errcheck // pipes support deadlines
	msg := make([]byte, 512)
	n, _ := rd.Read(msg)
	if got := strings.TrimSpace(string(msg[:n])); got != "ok" {
		cmd.Process.Kill() //nolint:errcheck // failed start
		cmd.Wait()         //nolint:errcheck // reap
		if got == "" {
			got = "exited without listening"
		}
		return 0, fmt.Errorf("DNS resolver: %s", got)
	}
	// Detached, it outlives this process; while this process lives, it
	// reaps it, so that a program embedding the engine collects no
	// zombies.
	go cmd.Wait() //nolint:errcheck // nothing to report
	return cmd.Process.Pid, nil
}

// ReadyPipe is the ready callback of a resolver started by StartResolver:
// it reports on file descriptor 3.
func ReadyPipe() func(error) {
	f := os.NewFile(3, "ready")
	return func(err error) {
		if f == nil {
			return
		}
		if err != nil {
			fmt.Fprintln(f, err)
		} else {
			fmt.Fprintln(f, "ok")
		}
		f.Close()
		f = nil
	}
}

// Helper is HelperName beside the hutch binary hutch (its symlinks
// resolved), or "" if there is no executable file of that name there.
func Helper(hutch string) string {
	if r, err := filepath.EvalSymlinks(hutch); err == nil {
		hutch = r
	}
	h := filepath.Join(filepath.Dir(hutch), HelperName)
	if fi, err := os.Stat(h); err != nil || !fi.Mode().IsRegular() || fi.Mode()&0o111 == 0 {
		return ""
	}
	return h
}

// helperFor is Helper(exe) if exe is hutch, given by its absolute path,
// with a helper beside it; else exe.
func helperFor(exe string) string {
	if !filepath.IsAbs(exe) {
		return exe
	}
	resolved := exe
	if r, err := filepath.EvalSymlinks(exe); err == nil {
		resolved = r
	}
	if filepath.Base(resolved) != "hutch" {
		return exe
	}
	if h := Helper(resolved); h != "" {
		return h
	}
	return exe
}
