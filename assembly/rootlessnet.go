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

	"hutch.dev/hutch/assembly/hostnet"
	"hutch.dev/hutch/policy"
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
	rootlessHostIf = "hutch0"
	rootlessTap    = "tap0"
	// slirpDNS is slirp4netns's DNS forwarder, which asks the host's
	// own resolvers: the rootless resolver's default upstream.
	slirpDNS = "10.0.2.3"
	// rootlessHostTable rejects the host's own addresses.
	rootlessHostTable = "hutch_host"
	rootlessStateFile = "usernet.json"
	rootlessNetnsLink = "netns"
)

// rootlessAddrs: every rootless sandbox has a router of its own, so all
// take the pool's first link.
func rootlessAddrs() (host, sandbox netip.Addr) {
	host = hostnet.Pool.Addr().Next()
	return host, host.Next()
}

// rootlessTable names the sandbox's nftables table in its router.
const rootlessTable = "hutch"

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
// directory so that any later hutch process can update or tear it down.
type userNet struct {
	// Router holds U, R and M; Sandbox holds S.
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

// RootlessNeed is something a rootless sandbox's network needs that the
// host lacks, with its fix.
type RootlessNeed struct {
	What, Fix string
}

func (n RootlessNeed) String() string { return n.What + " (" + n.Fix + ")" }

// tunDevice is the device slirp4netns opens to give the router its link.
const tunDevice = "/dev/net/tun"

// RootlessNetworkMissing says what a rootless sandbox's network needs
// and this user lacks on this host (programs, a usable /dev/net/tun),
// each with its fix; empty means nothing.
func RootlessNetworkMissing() []RootlessNeed {
	return rootlessNetworkMissing(exec.LookPath, tunDevice)
}

func rootlessNetworkMissing(lookPath func(string) (string, error), tun string) []RootlessNeed {
	var missing []RootlessNeed
	for _, p := range []struct{ bin, pkg string }{
		{"slirp4netns", "slirp4netns"}, {"nsenter", "util-linux"}, {"unshare", "util-linux"},
		{"ip", "iproute2"}, {"nft", "nftables"},
	} {
		if _, err := lookPath(p.bin); err != nil {
			missing = append(missing, RootlessNeed{What: p.bin + " not found", Fix: "as root: apt-get install " + p.pkg})
		}
	}
	f, err := os.OpenFile(tun, os.O_RDWR, 0)
	switch {
	case err == nil:
		f.Close()
	case errors.Is(err, os.ErrNotExist):
		missing = append(missing, RootlessNeed{What: tun + " does not exist", Fix: "as root: modprobe tun"})
	default:
		what := tun + " is not usable by this user"
		if fi, serr := os.Stat(tun); serr == nil {
			what += fmt.Sprintf(" (mode %04o)", fi.Mode().Perm())
		}
		var pe *os.PathError
		if errors.As(err, &pe) {
			err = pe.Err
		}
		missing = append(missing, RootlessNeed{
			What: what + ": " + err.Error(),
			Fix:  "as root: chmod 0666 " + tun + ` (udev's default; to keep it, a udev rule: KERNEL=="tun", MODE="0666")`,
		})
	}
	return missing
}

// CheckRootlessNetwork refuses network mode for a rootless sandbox when
// this host lacks what it needs, naming each with its fix.
func CheckRootlessNetwork(mode string) error {
	missing := RootlessNetworkMissing()
	if len(missing) == 0 {
		return nil
	}
	m := make([]string, len(missing))
	for i, n := range missing {
		m[i] = n.String()
	}
	return fmt.Errorf("--net %s without root: %s; see `hutch doctor`: %w", mode, strings.Join(m, "; "), errdefs.ErrFailedPrecondition)
}

// SetupRootlessNetwork makes a rootless sandbox's network (see above) for
// a sandbox whose state directory is s.Dir; hutchPath is the hutch binary that
// serves the resolver (`hutchPath resolverArgs... CFG`). runsc runs through
// RootlessRunsc for as long as the network is up. The firewall is in
// place before the link is up. On error nothing is left.
func SetupRootlessNetwork(ctx context.Context, s NetworkSpec, hutchPath string, resolverArgs []string) (_ *Network, err error) {
	if err := CheckRootlessNetwork(s.Mode); err != nil {
		return nil, err
	}
	var resolver *ResolverHandle
	var u *userNet
	defer func() {
		if err != nil {
			resolver.Stop()
			if u != nil {
				u.stop()
			}
			os.Remove(filepath.Join(s.Dir, rootlessStateFile)) //nolint:errcheck // may not exist
			os.Remove(filepath.Join(s.Dir, rootlessNetnsLink)) //nolint:errcheck // may not exist
		}
	}()
	// U and R (and M), or those an overlay workspace made already.
	if u, err = holdUserNS(s.Dir); err != nil {
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
	resolver, err = ResolverProcess{Exe: "nsenter", Args: u.enter(true, append([]string{hutchPath}, resolverArgs...)...)}.
		start(cfg, filepath.Join(s.Dir, "resolver.log"))
	if err != nil {
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

// holdUserNS returns the namespaces of the sandbox whose state directory
// is dir: those it has, or new ones. A process that sleeps holds them: a
// user namespace U that maps the user to root, and in it a network
// namespace (R, the router of a rootless network) and a mount namespace
// (M, where the sandbox's overlay workspaces are mounted and runsc runs).
func holdUserNS(dir string) (*userNet, error) {
	if u, err := readUserNet(dir); err == nil && u.Router.alive() {
		return u, nil
	}
	u := &userNet{}
	router := exec.Command("sleep", "infinity")
	router.SysProcAttr = &syscall.SysProcAttr{
		Setsid:                     true,
		Cloneflags:                 syscall.CLONE_NEWUSER | syscall.CLONE_NEWNET | syscall.CLONE_NEWNS,
		UidMappings:                []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Getuid(), Size: 1}},
		GidMappings:                []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Getgid(), Size: 1}},
		GidMappingsEnableSetgroups: false,
	}
	if err := router.Start(); err != nil {
		return nil, fmt.Errorf("user, network and mount namespaces: %w", err)
	}
	go router.Wait() //nolint:errcheck // reaped while this process lives
	var err error
	if u.Router, err = refOf(router.Process.Pid); err != nil {
		router.Process.Kill() //nolint:errcheck // failed start
		return nil, err
	}
	if err := u.save(dir); err != nil {
		u.stop()
		return nil, err
	}
	return u, nil
}

// MountRootlessOverlay mounts an overlayfs at merged for the rootless
// sandbox whose state directory is dir, in its mount namespace M (made if
// it has none): an unprivileged user may mount overlayfs in a user
// namespace of its own (Linux 5.11), where runsc, run through
// RootlessRunsc, and its gofer see it. The layer directories are opened
// in M (overlayfs takes no layer on a mount of another namespace) and
// given as /proc/self/fd of the mount(8) that inherits them, so that no
// path is parsed as options; they are opened as the user, with the
// user's rights only. Such a mount keeps its own extended attributes in
// the user.overlay. namespace (userxattr), which needs redirect_dir
// nofollow: a directory of the lower layer renamed is copied, as with
// root's redirect_dir=off.
func MountRootlessOverlay(ctx context.Context, dir, lower, upper, work, merged string) error {
	u, err := holdUserNS(dir)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	const script = `exec 3<"$1" 4<"$2" 5<"$3" && exec mount -t overlay overlay -o nosuid,nodev,lowerdir=/proc/self/fd/3,upperdir=/proc/self/fd/4,workdir=/proc/self/fd/5,userxattr,redirect_dir=nofollow,metacopy=off,index=off "$4"`
	cmd := exec.CommandContext(ctx, "nsenter", u.enterMount("sh", "-c", script, "sh", lower, upper, work, merged)...)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("mount overlayfs in the user's namespace: %v: %s", err, strings.TrimSpace(string(out)))
	}
	return nil
}

// StopRootlessNamespaces ends what holds the namespaces of a rootless
// sandbox whose state directory is dir (and its network, if it has one),
// and removes their files: its overlay mounts go with the last process in
// M. It is idempotent.
func StopRootlessNamespaces(dir string) error { return TeardownRootlessNetwork(dir, nil) }

// enterMount is nsenter's arguments to run args as root of U in M.
func (u *userNet) enterMount(args ...string) []string {
	return append([]string{"--target=" + strconv.Itoa(u.Router.Pid), "--user", "--mount", "--preserve-credentials", "--"}, args...)
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

// RootlessRunsc is what runsc runs through (runsc.Runsc's Wrapper) for
// the rootless sandbox whose state directory is dir while it has
// namespaces of its own (a network, overlay workspaces): nsenter into U,
// as its root (the user's own credentials), which runsc must be to join
// the sandbox's network namespace, and into M, where its overlay
// workspaces are mounted. Nil means run runsc as it is (none, or they
// are down).
func RootlessRunsc(dir string) []string {
	u, err := readUserNet(dir)
	if err != nil || !u.Router.alive() {
		return nil
	}
	nsenter, err := exec.LookPath("nsenter")
	if err != nil {
		return nil
	}
	return append([]string{nsenter}, u.enterMount()...)
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
	for _, f := range []string{rootlessStateFile, rootlessNetnsLink} {
		if _, err := os.Stat(filepath.Join(dir, f)); err == nil {
			left = append(left, "file "+f)
		}
	}
	return left
}
