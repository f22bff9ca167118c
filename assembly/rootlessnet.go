package assembly

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/containerd/errdefs"

	"sbx.dev/sbx/assembly/hostnet"
	"sbx.dev/sbx/policy"
)

// A rootless sandbox's network (docs/decisions/0022-rootless-network.md)
// lives in namespaces its user owns: a user namespace U, in it a router
// network namespace R and the sandbox's network namespace S, joined by a
// veth pair. slirp4netns gives R a tap device with NAT to the host's
// network. R holds the same nftables table as a root sandbox's host side
// (policy.RenderFirewall, with R in the host's place) plus a table that
// rejects the host's own addresses, and runs the DNS resolver; runsc runs
// as root of U, so that it may join S, and puts gVisor in a user
// namespace nested in U, which holds no privilege over R or S.
const (
	rootlessHostIf = "sbx0"
	rootlessTap    = "tap0"
	// slirpDNS is slirp4netns's DNS forwarder, which asks the host's
	// own resolvers: the rootless resolver's default upstream.
	slirpDNS = "10.0.2.3"
	// rootlessHostTable rejects the host's own addresses.
	rootlessHostTable = "sbx_host"
	rootlessStateFile = "usernet.json"
	rootlessRunscFile = "runsc-userns"
	rootlessNetnsLink = "netns"
)

// rootlessAddrs: every rootless sandbox has a router of its own, so all
// take the pool's first link.
func rootlessAddrs() (host, sandbox netip.Addr) {
	host = hostnet.Pool.Addr().Next()
	return host, host.Next()
}

// rootlessTable names the sandbox's nftables table in its router.
const rootlessTable = "sbx"

// procRef names a process by its PID and start time.
type procRef struct {
	Pid   int    `json:"pid"`
	Start uint64 `json:"start"`
}

func refOf(pid int) (procRef, error) {
	start, err := ProcessStart(pid)
	return procRef{Pid: pid, Start: start}, err
}

func (p procRef) alive() bool { return p.Pid != 0 && SameProcess(p.Pid, p.Start) }

func (p procRef) kill() {
	if p.alive() {
		syscall.Kill(p.Pid, syscall.SIGKILL) //nolint:errcheck // may be gone
	}
}

// userNet is what SetupRootlessNetwork started, saved in the sandbox's
// directory so that any later sbx process can update or tear it down.
type userNet struct {
	// Router holds U and R; Sandbox holds S.
	Router  procRef `json:"router"`
	Sandbox procRef `json:"sandbox"`
	Slirp   procRef `json:"slirp"`
}

func readUserNet(dir string) (*userNet, error) {
	b, err := os.ReadFile(filepath.Join(dir, rootlessStateFile))
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("sandbox has no rootless network: %w", errdefs.ErrNotFound)
		}
		return nil, err
	}
	var u userNet
	if err := json.Unmarshal(b, &u); err != nil {
		return nil, fmt.Errorf("%s: %w", rootlessStateFile, err)
	}
	return &u, nil
}

func (u *userNet) save(dir string) error {
	b, err := json.Marshal(u)
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, rootlessStateFile), b, 0o600)
}

// RootlessNetworkMissing says what of the host's software a rootless
// sandbox's network needs and is not there, with the fix; empty means
// nothing.
func RootlessNetworkMissing() []string {
	var missing []string
	for _, p := range []struct{ bin, pkg string }{
		{"slirp4netns", "slirp4netns"}, {"nsenter", "util-linux"}, {"unshare", "util-linux"},
		{"ip", "iproute2"}, {"nft", "nftables"},
	} {
		if _, err := exec.LookPath(p.bin); err != nil {
			missing = append(missing, fmt.Sprintf("%s (install %s)", p.bin, p.pkg))
		}
	}
	if f, err := os.OpenFile("/dev/net/tun", os.O_RDWR, 0); err != nil {
		missing = append(missing, "/dev/net/tun not usable ("+err.Error()+"; udev's default mode is 0666)")
	} else {
		f.Close()
	}
	return missing
}

// SetupRootlessNetwork makes a rootless sandbox's network (see above) for
// a sandbox whose state directory is s.Dir; sbxPath is the sbx binary that
// serves the resolver (`sbxPath resolverArgs... CFG`), runscPath the runsc
// that RootlessRunsc is to run. The firewall is in place before the link
// is up. On error nothing is left.
func SetupRootlessNetwork(ctx context.Context, s NetworkSpec, sbxPath string, resolverArgs []string, runscPath string) (_ *Network, err error) {
	if missing := RootlessNetworkMissing(); len(missing) > 0 {
		return nil, fmt.Errorf("--net %s without root needs: %s: %w", s.Mode, strings.Join(missing, ", "), errdefs.ErrNotImplemented)
	}
	u := &userNet{}
	var resolver *ResolverHandle
	defer func() {
		if err != nil {
			resolver.Stop()
			u.stop()
			os.Remove(filepath.Join(s.Dir, rootlessStateFile)) //nolint:errcheck // may not exist
			os.Remove(filepath.Join(s.Dir, rootlessRunscFile)) //nolint:errcheck // may not exist
			os.Remove(filepath.Join(s.Dir, rootlessNetnsLink)) //nolint:errcheck // may not exist
		}
	}()
	// U and R: the user is root of U.
	router := exec.Command("sleep", "infinity")
	router.SysProcAttr = &syscall.SysProcAttr{
		Setsid:                     true,
		Cloneflags:                 syscall.CLONE_NEWUSER | syscall.CLONE_NEWNET,
		UidMappings:                []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Getuid(), Size: 1}},
		GidMappings:                []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Getgid(), Size: 1}},
		GidMappingsEnableSetgroups: false,
	}
	if err := router.Start(); err != nil {
		return nil, fmt.Errorf("user and network namespace: %w", err)
	}
	go router.Wait() //nolint:errcheck // reaped while this process lives
	if u.Router, err = refOf(router.Process.Pid); err != nil {
		return nil, err
	}
	if err := u.save(s.Dir); err != nil {
		return nil, err
	}
	// S, in U.
	sandbox := exec.Command("nsenter", u.enter(false, "unshare", "--net", "sleep", "infinity")...)
	sandbox.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := sandbox.Start(); err != nil {
		return nil, fmt.Errorf("sandbox network namespace: %w", err)
	}
	go sandbox.Wait() //nolint:errcheck // reaped while this process lives
	if u.Sandbox, err = refOf(sandbox.Process.Pid); err != nil {
		return nil, err
	}
	if err := u.save(s.Dir); err != nil {
		return nil, err
	}
	if err := waitNetns(ctx, u.Sandbox.Pid, u.Router.Pid); err != nil {
		return nil, err
	}

	hostIP, sandboxIP := rootlessAddrs()
	if err := u.applyFirewall(ctx, s.Mode, s.Allow); err != nil {
		return nil, err
	}
	// The link, R's side first (forwarding on in R only).
	if err := u.run(ctx, u.Router.Pid, fmt.Sprintf(`set -e
echo 1 > /proc/sys/net/ipv4/ip_forward
ip link add %[1]s type veth peer name eth0 netns %[2]d
ip addr add %[3]s/30 dev %[1]s
ip link set %[1]s up
`, rootlessHostIf, u.Sandbox.Pid, hostIP)); err != nil {
		return nil, fmt.Errorf("router link: %w", err)
	}
	if err := u.run(ctx, u.Sandbox.Pid, fmt.Sprintf(`set -e
ip link set lo up
ip addr add %s/30 dev eth0
ip link set eth0 up
ip route add default via %s
`, sandboxIP, hostIP)); err != nil {
		return nil, fmt.Errorf("sandbox link: %w", err)
	}
	if u.Slirp, err = startSlirp(ctx, u.Router.Pid, filepath.Join(s.Dir, "slirp4netns.log")); err != nil {
		return nil, err
	}
	if err := u.save(s.Dir); err != nil {
		return nil, err
	}

	resolvConf := filepath.Join(s.Dir, "resolv.conf")
	if err := os.WriteFile(resolvConf, []byte("nameserver "+hostIP.String()+"\n"), 0o644); err != nil {
		return nil, err
	}
	upstreams := []string{net.JoinHostPort(slirpDNS, "53")}
	if len(s.DNS) > 0 {
		upstreams = nil
		for _, d := range s.DNS {
			upstreams = append(upstreams, net.JoinHostPort(d, "53"))
		}
	}
	cfg := ResolverConfigPath(s.Dir)
	if err := hostnet.WriteResolverConfig(cfg, hostnet.ResolverConfig{
		Listen: net.JoinHostPort(hostIP.String(), "53"), Upstreams: upstreams,
		Mode: s.Mode, Allow: s.Allow, Table: rootlessTable,
	}); err != nil {
		return nil, err
	}
	// The resolver runs in R as root of U: it listens on R's side of the
	// link and admits answers into R's table.
	resolver, err = ResolverProcess{Exe: "nsenter", Args: u.enter(true, append([]string{sbxPath}, resolverArgs...)...)}.
		start(cfg, filepath.Join(s.Dir, "resolver.log"))
	if err != nil {
		return nil, err
	}
	if err := writeRunscWrapper(s.Dir, u.Router.Pid, runscPath); err != nil {
		return nil, err
	}
	// The spec names S by a path that stays the same across a pause,
	// as a root sandbox's named namespace does: a checkpoint restores
	// from the bundle written at create.
	link := filepath.Join(s.Dir, rootlessNetnsLink)
	os.Remove(link) //nolint:errcheck // may not exist
	if err := os.Symlink(fmt.Sprintf("/proc/%d/ns/net", u.Sandbox.Pid), link); err != nil {
		return nil, err
	}
	return &Network{
		NetnsPath: link,
		SandboxIP: sandboxIP.String(),
		Mounts: []specs.Mount{{
			Destination: "/etc/resolv.conf", Type: "bind", Source: resolvConf,
			Options: []string{"rbind", "ro"},
		}},
		Resolver: resolver,
	}, nil
}

// enter is nsenter's arguments to run args as root of U (the user's own
// credentials, which U maps to root), in R too with net.
func (u *userNet) enter(net bool, args ...string) []string {
	a := []string{"--target=" + strconv.Itoa(u.Router.Pid), "--user", "--preserve-credentials"}
	if net {
		a = append(a, "--net")
	}
	return append(append(a, "--"), args...)
}

// run runs a shell script as root of U in the network namespace of pid
// (R or S).
func (u *userNet) run(ctx context.Context, pid int, script string) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "nsenter", "--target="+strconv.Itoa(pid), "--user", "--net", "--preserve-credentials", "--", "sh", "-c", script)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%v: %s", err, strings.TrimSpace(out.String()))
	}
	return nil
}

// nft runs an nft script in R.
func (u *userNet) nft(ctx context.Context, script string) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "nsenter", u.enter(true, "nft", "-f", "-")...)
	cmd.Stdin = strings.NewReader(script)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("nft in the sandbox's router namespace: %v: %s", err, strings.TrimSpace(out.String()))
	}
	return nil
}

// applyFirewall replaces R's tables: the policy's, as a root sandbox's
// host side has it, and the one rejecting the host's own addresses,
// which in R are not R's own and so not met by the policy's input chain.
func (u *userNet) applyFirewall(ctx context.Context, mode string, allow []policy.AllowRule) error {
	hostIP, sandboxIP := rootlessAddrs()
	script := policy.RenderFirewall(policy.FirewallConfig{
		Table: rootlessTable, HostIf: rootlessHostIf, HostIP: hostIP, SandboxIP: sandboxIP,
		Mode: mode, Allow: allow,
	}) + renderHostDenial(hostAddrs())
	return u.nft(ctx, script)
}

// hostAddrs are the host's own IPv4 addresses, as this process sees them.
func hostAddrs() []netip.Addr {
	var out []netip.Addr
	addrs, _ := net.InterfaceAddrs()
	for _, a := range addrs {
		if p, err := netip.ParsePrefix(a.String()); err == nil && p.Addr().Is4() {
			out = append(out, p.Addr())
		}
	}
	return out
}

// renderHostDenial is the table that rejects, before any accept of the
// policy's, what the sandbox sends to the host's own addresses: slirp4netns
// would connect to them from the host, where root's firewall keeps every
// sandbox off its host.
func renderHostDenial(addrs []netip.Addr) string {
	var b strings.Builder
	fmt.Fprintf(&b, "add table inet %[1]s\ndelete table inet %[1]s\ntable inet %[1]s {\n", rootlessHostTable)
	fmt.Fprintf(&b, "\tchain forward {\n\t\ttype filter hook forward priority filter - 1; policy accept;\n")
	if len(addrs) > 0 {
		s := make([]string, len(addrs))
		for i, a := range addrs {
			s[i] = a.String()
		}
		fmt.Fprintf(&b, "\t\tiifname %q ip daddr { %s } meta l4proto tcp reject with tcp reset\n", rootlessHostIf, strings.Join(s, ", "))
		fmt.Fprintf(&b, "\t\tiifname %q ip daddr { %s } reject with icmpx type admin-prohibited\n", rootlessHostIf, strings.Join(s, ", "))
	}
	b.WriteString("\t}\n}\n")
	return b.String()
}

// waitNetns waits until pid is in a network namespace of its own (unshare
// has run), not that of router.
func waitNetns(ctx context.Context, pid, router int) error {
	want, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/net", router))
	if err != nil {
		return err
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		got, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/net", pid))
		if err != nil {
			return fmt.Errorf("sandbox network namespace: %w", err)
		}
		if got != want {
			if comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid)); strings.TrimSpace(string(comm)) == "sleep" {
				return nil
			}
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("sandbox network namespace not made in time: %w", errdefs.ErrUnavailable)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// startSlirp starts slirp4netns on R, detached, and waits until its tap
// device is configured. Loopback on the host is not reachable through it
// (--disable-host-loopback); it runs in a sandbox and under seccomp of its
// own, as it parses what the sandbox sends.
func startSlirp(ctx context.Context, router int, logPath string) (procRef, error) {
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return procRef{}, err
	}
	defer logf.Close()
	rd, wr, err := os.Pipe()
	if err != nil {
		return procRef{}, err
	}
	defer rd.Close()
	cmd := exec.Command("slirp4netns", "--configure", "--mtu=65520", "--disable-host-loopback",
		"--enable-sandbox", "--enable-seccomp", "--ready-fd=3", strconv.Itoa(router), rootlessTap)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.ExtraFiles = []*os.File{wr}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		wr.Close()
		return procRef{}, fmt.Errorf("start slirp4netns: %w", err)
	}
	wr.Close()
	ref, err := refOf(cmd.Process.Pid)
	rd.SetReadDeadline(time.Now().Add(10 * time.Second)) //nolint:errcheck // pipes support deadlines
	b := make([]byte, 1)
	if n, _ := rd.Read(b); n != 1 || err != nil {
		cmd.Process.Kill() //nolint:errcheck // failed start
		cmd.Wait()         //nolint:errcheck // reap
		log, _ := os.ReadFile(logPath)
		return procRef{}, fmt.Errorf("slirp4netns did not come up: %s", strings.TrimSpace(string(log)))
	}
	go cmd.Wait() //nolint:errcheck // reaped while this process lives
	return ref, nil
}

// writeRunscWrapper writes the program that runs runsc as root of U
// (RootlessRunsc).
func writeRunscWrapper(dir string, router int, runscPath string) error {
	nsenter, err := exec.LookPath("nsenter")
	if err != nil {
		return err
	}
	script := fmt.Sprintf("#!/bin/sh\nexec %s --target=%d --user --preserve-credentials -- %s \"$@\"\n", shellQuote(nsenter), router, shellQuote(runscPath))
	return os.WriteFile(filepath.Join(dir, rootlessRunscFile), []byte(script), 0o700)
}

func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// RootlessRunsc is the program to run runsc through for the rootless
// sandbox whose state directory is dir while its network is up: runsc
// must be root of the user namespace that owns the sandbox's network
// namespace to join it. Empty means run runsc as it is (no rootless network, or it is down).
func RootlessRunsc(dir string) string {
	u, err := readUserNet(dir)
	if err != nil || !u.Router.alive() {
		return ""
	}
	p := filepath.Join(dir, rootlessRunscFile)
	if _, err := os.Stat(p); err != nil {
		return ""
	}
	return p
}

// UpdateRootlessNetwork replaces a rootless sandbox's policy in its
// router, in UpdateNetwork's order.
func UpdateRootlessNetwork(ctx context.Context, s NetworkSpec) error {
	u, err := readUserNet(s.Dir)
	if err != nil {
		return err
	}
	if !u.Router.alive() {
		return fmt.Errorf("the sandbox's network namespace is gone: %w", errdefs.ErrFailedPrecondition)
	}
	cfgPath := ResolverConfigPath(s.Dir)
	cfg, err := hostnet.ReadResolverConfig(cfgPath)
	if err != nil {
		return err
	}
	cfg.Mode, cfg.Allow = s.Mode, s.Allow
	return hostnet.UpdatePolicy(cfgPath, *cfg, func() error {
		return u.applyFirewall(ctx, s.Mode, s.Allow)
	})
}

// stop kills what u started, and waits (briefly) until it is gone; the
// namespaces go with their last process.
func (u *userNet) stop() {
	procs := []procRef{u.Slirp, u.Sandbox, u.Router}
	for _, p := range procs {
		p.kill()
	}
	deadline := time.Now().Add(2 * time.Second)
	for _, p := range procs {
		for p.alive() && time.Now().Before(deadline) {
			time.Sleep(5 * time.Millisecond)
		}
	}
}

// TeardownRootlessNetwork stops the resolver and everything
// SetupRootlessNetwork started for the sandbox whose state directory is
// dir, and removes its files. It is idempotent.
func TeardownRootlessNetwork(dir string, resolver *ResolverHandle) error {
	resolver.Stop()
	u, err := readUserNet(dir)
	if errdefs.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	u.stop()
	return errors.Join(
		ignoreMissing(os.Remove(filepath.Join(dir, rootlessRunscFile))),
		ignoreMissing(os.Remove(filepath.Join(dir, rootlessNetnsLink))),
		ignoreMissing(os.Remove(filepath.Join(dir, rootlessStateFile))),
	)
}

func ignoreMissing(err error) error {
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	return err
}

// RootlessLeftovers lists what of a rootless network set-up still exists
// for the sandbox whose state directory is dir; empty means none.
func RootlessLeftovers(dir string) []string {
	var left []string
	u, err := readUserNet(dir)
	if err == nil {
		for name, p := range map[string]procRef{"router namespace holder": u.Router, "sandbox namespace holder": u.Sandbox, "slirp4netns": u.Slirp} {
			if p.alive() {
				left = append(left, fmt.Sprintf("%s (process %d)", name, p.Pid))
			}
		}
	}
	for _, f := range []string{rootlessStateFile, rootlessRunscFile, rootlessNetnsLink} {
		if _, err := os.Stat(filepath.Join(dir, f)); err == nil {
			left = append(left, "file "+f)
		}
	}
	return left
}
