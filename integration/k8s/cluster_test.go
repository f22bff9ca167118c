// Package k8s runs pods with runtimeClassName hutch under a real single-node
// Kubernetes: etcd, kube-apiserver, kube-controller-manager, kube-scheduler
// and a kubelet on 127.0.0.1, over a private containerd set up for hutch by
// deploy/kubernetes/install-node.sh, with the reference CNI plugins' ptp
// network. `make k8s-tools` builds the cluster's binaries and `make
// k8s-test` runs the tests (HUTCH_K8S=1, as root); everything they start or
// change on the host is removed or put back afterwards.
package k8s

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Names the tests use for the cluster's images and node.
const (
	nodeName     = "127.0.0.1"
	pauseImage   = "localhost/hutch/pause:1"
	busyboxImage = "localhost/hutch/busybox:latest"
)

// podSubnet is the CNI network's range; the host side of each pod's veth
// gets podGateway. Each test process picks its own /24, so that two
// clusters on one host never hand out the same pod address.
var (
	podNet     = 20 + os.Getpid()%200
	podSubnet  = fmt.Sprintf("10.244.%d.0/24", podNet)
	podGateway = fmt.Sprintf("10.244.%d.1", podNet)
)

// kubeletSysctls are the kernel settings the kubelet changes at start;
// the cluster puts them back when it stops.
var kubeletSysctls = []string{
	"vm/overcommit_memory", "vm/panic_on_oom", "kernel/panic", "kernel/panic_on_oops",
	"kernel/keys/root_maxkeys", "kernel/keys/root_maxbytes", "net/ipv4/ip_forward",
}

// cluster is the running test cluster.
type cluster struct {
	repo, bin, k8sBin string
	dir               string
	kubeconfig        string
	sock              string
	shimConfig        string
	// checkpoints is the node's checkpoint directory (the shim's
	// checkpoint_dir, hutch-node's --checkpoint-dir).
	checkpoints    string
	cgroupName     string
	procs          []*proc
	sysctls        map[string]string
	logLinksBefore []string
	logDirCreated  bool
}

// proc is one daemon of the cluster.
type proc struct {
	name string
	cmd  *exec.Cmd
	done chan struct{}
}

// startCluster starts the whole cluster. The returned cluster is non-nil
// once anything was started, even on error, so that stop removes it.
func startCluster() (*cluster, error) {
	c := &cluster{}
	var err error
	if c.repo, err = filepath.Abs("../.."); err != nil {
		return nil, err
	}
	c.bin = os.Getenv("HUTCH_BIN")
	if c.bin == "" {
		c.bin = filepath.Join(c.repo, "bin")
	}
	c.k8sBin = filepath.Join(c.repo, "bin", "k8s")
	if d := os.Getenv("HUTCH_K8S_BIN"); d != "" {
		c.k8sBin = d
	}
	for _, f := range []string{"hutch", "runsc", "containerd", "ctr", "crictl", "containerd-shim-hutch-v1", "images/pause.tar", "images/busybox.tar"} {
		if _, err := os.Stat(filepath.Join(c.bin, f)); err != nil {
			return nil, fmt.Errorf("%s not built (make build shim containerd-tools): %w", f, err)
		}
	}
	for _, f := range []string{"etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet", "kubectl", "cni/ptp", "cni/host-local", "cni/loopback"} {
		if _, err := os.Stat(filepath.Join(c.k8sBin, f)); err != nil {
			return nil, fmt.Errorf("%s not built (make k8s-tools): %w", f, err)
		}
	}
	if c.dir, err = os.MkdirTemp("", "hutch-k8s-"); err != nil {
		return nil, err
	}
	c.saveHostState()
	return c, c.start()
}

func (c *cluster) path(p ...string) string { return filepath.Join(append([]string{c.dir}, p...)...) }

// saveHostState records what the kubelet changes on the host.
func (c *cluster) saveHostState() {
	c.sysctls = map[string]string{}
	for _, k := range kubeletSysctls {
		if b, err := os.ReadFile("/proc/sys/" + k); err == nil {
			c.sysctls[k] = strings.TrimSpace(string(b))
		}
	}
	if ents, err := os.ReadDir("/var/log/containers"); err == nil {
		for _, e := range ents {
			c.logLinksBefore = append(c.logLinksBefore, e.Name())
		}
	} else {
		c.logDirCreated = true
	}
}

func (c *cluster) start() error {
	p, err := newPKI(c.path("pki"))
	if err != nil {
		return err
	}
	ports, err := freePorts(6)
	if err != nil {
		return err
	}
	etcdPort, peerPort, apiPort, kcmPort, schedPort, kubeletPort := ports[0], ports[1], ports[2], ports[3], ports[4], ports[5]
	server := fmt.Sprintf("https://127.0.0.1:%d", apiPort)
	loop := []net.IP{net.ParseIP("127.0.0.1"), net.ParseIP("10.0.0.1")}
	for _, cert := range []struct {
		name, cn string
		orgs     []string
		server   bool
	}{
		{"apiserver", "kube-apiserver", nil, true},
		{"admin", "admin", []string{"system:masters"}, false},
		{"apiserver-kubelet-client", "kube-apiserver-kubelet-client", []string{"system:masters"}, false},
		{"kubelet", "system:node:" + nodeName, []string{"system:nodes"}, false},
	} {
		if err := p.issue(cert.name, cert.cn, cert.orgs, loop, []string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc"}, cert.server); err != nil {
			return err
		}
	}
	if err := p.serviceAccountKey(); err != nil {
		return err
	}
	c.kubeconfig = c.path("admin.conf")
	if err := p.kubeconfig(c.kubeconfig, server, "admin"); err != nil {
		return err
	}
	if err := p.kubeconfig(c.path("kubelet.conf"), server, "kubelet"); err != nil {
		return err
	}

	// etcd
	etcdURL := fmt.Sprintf("http://127.0.0.1:%d", etcdPort)
	peerURL := fmt.Sprintf("http://127.0.0.1:%d", peerPort)
	if err := c.run("etcd", filepath.Join(c.k8sBin, "etcd"), nil,
		"--name", "test", "--data-dir", c.path("etcd"),
		"--listen-client-urls", etcdURL, "--advertise-client-urls", etcdURL,
		"--listen-peer-urls", peerURL, "--initial-advertise-peer-urls", peerURL,
		"--initial-cluster", "test="+peerURL); err != nil {
		return err
	}
	if err := waitHTTP(etcdURL+"/health", nil, time.Minute); err != nil {
		return fmt.Errorf("etcd: %w", err)
	}

	// kube-apiserver
	if err := c.run("kube-apiserver", filepath.Join(c.k8sBin, "kube-apiserver"), nil,
		"--etcd-servers", etcdURL,
		"--bind-address", "127.0.0.1", "--secure-port", strconv.Itoa(apiPort),
		"--advertise-address", "127.0.0.1", "--endpoint-reconciler-type", "none",
		"--cert-dir", c.path("apiserver"),
		"--tls-cert-file", p.path("apiserver.crt"), "--tls-private-key-file", p.path("apiserver.key"),
		"--client-ca-file", p.path("ca.crt"),
		"--kubelet-client-certificate", p.path("apiserver-kubelet-client.crt"),
		"--kubelet-client-key", p.path("apiserver-kubelet-client.key"),
		"--service-account-issuer", "https://kubernetes.default.svc",
		"--service-account-key-file", p.path("sa.pub"),
		"--service-account-signing-key-file", p.path("sa.key"),
		"--service-cluster-ip-range", "10.0.0.0/24",
		"--authorization-mode", "Node,RBAC",
		// As kubeadm's: the installer DaemonSet's pod is privileged.
		"--allow-privileged=true"); err != nil {
		return err
	}
	admin, err := tls.LoadX509KeyPair(p.path("admin.crt"), p.path("admin.key"))
	if err != nil {
		return err
	}
	roots := x509.NewCertPool()
	roots.AddCert(p.caCert)
	if err := waitHTTP(server+"/readyz", &tls.Config{RootCAs: roots, Certificates: []tls.Certificate{admin}}, 2*time.Minute); err != nil {
		return fmt.Errorf("kube-apiserver: %w", err)
	}

	// kube-controller-manager and kube-scheduler
	if err := c.run("kube-controller-manager", filepath.Join(c.k8sBin, "kube-controller-manager"), nil,
		"--kubeconfig", c.kubeconfig, "--leader-elect=false",
		"--bind-address", "127.0.0.1", "--secure-port", strconv.Itoa(kcmPort), "--cert-dir", c.path("kcm"),
		"--service-account-private-key-file", p.path("sa.key"), "--root-ca-file", p.path("ca.crt"),
		"--use-service-account-credentials=false"); err != nil {
		return err
	}
	if err := c.run("kube-scheduler", filepath.Join(c.k8sBin, "kube-scheduler"), nil,
		"--kubeconfig", c.kubeconfig, "--leader-elect=false",
		"--bind-address", "127.0.0.1", "--secure-port", strconv.Itoa(schedPort), "--cert-dir", c.path("scheduler")); err != nil {
		return err
	}

	// The node: hutch installed by the operator's script, containerd, CNI.
	if err := c.setUpNode(); err != nil {
		return err
	}
	if err := c.startContainerd(); err != nil {
		return err
	}
	if err := c.importImages(); err != nil {
		return err
	}
	if err := c.startKubelet(p, kubeletPort); err != nil {
		return err
	}

	// Ready node, labelled for hutch; the RuntimeClass of deploy/kubernetes;
	// the default service account pods wait for.
	if err := c.waitKubectl(2*time.Minute, func(out string) bool { return out == "True" },
		"get", "node", nodeName, "-o", `jsonpath={.status.conditions[?(@.type=="Ready")].status}`); err != nil {
		return fmt.Errorf("node not ready: %w", err)
	}
	if _, err := c.kubectl(nil, "label", "node", nodeName, "hutch.dev/runtime=true"); err != nil {
		return err
	}
	if _, err := c.kubectl(nil, "apply", "-f", filepath.Join(c.repo, "deploy", "kubernetes", "runtimeclass.yaml")); err != nil {
		return err
	}
	return c.waitKubectl(time.Minute, func(out string) bool { return out == "default" },
		"get", "serviceaccount", "default", "-o", "jsonpath={.metadata.name}")
}

// setUpNode installs hutch the way an operator does, with
// deploy/kubernetes/install-node.sh, into the test's directory.
func (c *cluster) setUpNode() error {
	cmd := exec.Command("sh", filepath.Join(c.repo, "deploy", "kubernetes", "install-node.sh"))
	cmd.Env = append(os.Environ(),
		"BIN_DIR="+c.bin,
		"PREFIX="+c.path("node", "usr", "local"),
		"HUTCH_ETC="+c.path("node", "etc", "hutch"),
		"CONTAINERD_CONF_D="+c.path("node", "etc", "containerd", "conf.d"))
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("install-node.sh: %w: %s", err, out)
	}
	c.shimConfig = c.path("node", "etc", "hutch", "containerd-shim-hutch-v1.toml")
	c.checkpoints = c.path("checkpoints")
	if err := c.setPolicy(""); err != nil {
		return err
	}
	// The pod network: ptp veths from podSubnet, a default route through
	// the node (which routes nowhere but to the test's own namespaces),
	// state in the test's directory.
	conflist := fmt.Sprintf(`{
  "cniVersion": "1.0.0",
  "name": "hutch-test",
  "plugins": [{
    "type": "ptp",
    "ipMasq": false,
    "ipam": {"type": "host-local", "ranges": [[{"subnet": %q, "gateway": %q}]], "routes": [{"dst": "0.0.0.0/0"}], "dataDir": %q}
  }]
}`, podSubnet, podGateway, c.path("cni", "ipam"))
	if err := os.MkdirAll(c.path("cni", "net.d"), 0o755); err != nil {
		return err
	}
	return os.WriteFile(c.path("cni", "net.d", "10-hutch-test.conflist"), []byte(conflist), 0o644)
}

// setPolicy writes the operator's policy: the shim's options file, which a
// pod's shim reads when the pod is created.
func (c *cluster) setPolicy(policy string) error {
	body := fmt.Sprintf("runsc_root = %q\ncheckpoint_dir = %q\n%s\n", c.path("runsc"), c.checkpoints, policy)
	return os.WriteFile(c.shimConfig, []byte(body), 0o644)
}

func (c *cluster) startContainerd() error {
	c.sock = c.path("containerd.sock")
	cfg := fmt.Sprintf(`version = 3
root = %q
state = %q
imports = [%q]
[grpc]
  address = %q
[ttrpc]
  address = %q
[plugins.'io.containerd.cri.v1.images'.pinned_images]
  sandbox = %q
[plugins.'io.containerd.cri.v1.runtime']
  netns_mounts_under_state_dir = true
  # Hosts (VMs, containers) that forbid lowering oom_score_adj would
  # otherwise fail runc's containers: the installer DaemonSet's pod.
  restrict_oom_score_adj = true
[plugins.'io.containerd.cri.v1.runtime'.cni]
  bin_dirs = [%q]
  conf_dir = %q
# runc's state in the test's directory, not the host's /run/containerd.
[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
  [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
    Root = %q
`, c.path("containerd", "root"), c.path("containerd", "state"), c.path("node", "etc", "containerd", "conf.d", "*.toml"),
		c.sock, c.sock+".ttrpc", pauseImage, filepath.Join(c.k8sBin, "cni"), c.path("cni", "net.d"), c.path("runc"))
	if err := os.WriteFile(c.path("containerd.toml"), []byte(cfg), 0o644); err != nil {
		return err
	}
	// containerd finds the shim on its PATH, where install-node.sh put it,
	// and runc's shim (the default runtime, for the installer DaemonSet's
	// pod) in a directory of its own: not the hutch shim in bin/.
	if err := os.MkdirAll(c.path("runc-shim"), 0o755); err != nil {
		return err
	}
	if err := os.Symlink(filepath.Join(c.bin, "containerd-shim-runc-v2"), c.path("runc-shim", "containerd-shim-runc-v2")); err != nil && !os.IsExist(err) {
		return err
	}
	env := []string{"PATH=" + c.path("node", "usr", "local", "bin") + ":" + c.path("runc-shim") + ":" + os.Getenv("PATH")}
	if err := c.run("containerd", filepath.Join(c.bin, "containerd"), env, "--config", c.path("containerd.toml")); err != nil {
		return err
	}
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(200 * time.Millisecond) {
		if _, err := c.ctr("version"); err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return errors.New("containerd did not start")
		}
	}
}

func (c *cluster) stopProc(name string) {
	for i, p := range c.procs {
		if p.name == name {
			p.stop()
			c.procs = slices.Delete(c.procs, i, i+1)
			return
		}
	}
}

// importImages puts busybox and the pause image into containerd's k8s.io
// namespace under names CRI does not rewrite (no registry here), then
// restarts containerd for CRI to see them.
func (c *cluster) importImages() error {
	hutch := func(args ...string) error {
		out, err := exec.Command(filepath.Join(c.bin, "hutch"), append([]string{"--root", c.path("hutch")}, args...)...).CombinedOutput()
		if err != nil {
			return fmt.Errorf("hutch %s: %w: %s", strings.Join(args, " "), err, out)
		}
		return nil
	}
	archive := c.path("busybox.oci.tar")
	if err := hutch("image", "import", "busybox", filepath.Join(c.bin, "images", "busybox.tar")); err != nil {
		return err
	}
	if err := hutch("image", "export", "busybox", archive); err != nil {
		return err
	}
	for _, args := range [][]string{
		{"image", "import", archive},
		{"image", "import", filepath.Join(c.bin, "images", "pause.tar")},
		{"image", "tag", "busybox:latest", busyboxImage},
		{"image", "tag", "pause:hutch", pauseImage},
		{"image", "rm", "busybox:latest", "pause:hutch"},
	} {
		if _, err := c.ctr(args...); err != nil {
			return err
		}
	}
	c.stopProc("containerd")
	return c.startContainerd()
}

func (c *cluster) startKubelet(p *pki, port int) error {
	// The kubelet's pods live below a cgroup of the test's own, in every
	// hierarchy, made before the kubelet starts (it must exist).
	c.cgroupName = filepath.Base(c.dir)
	for _, h := range cgroupHierarchies() {
		d := filepath.Join(h, c.cgroupName)
		if err := os.Mkdir(d, 0o755); err != nil {
			return err
		}
		if filepath.Base(h) == "cpuset" {
			for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
				b, err := os.ReadFile(filepath.Join(h, f))
				if err != nil {
					return err
				}
				if err := os.WriteFile(filepath.Join(d, f), b, 0o644); err != nil {
					return err
				}
			}
		}
	}
	cfg := fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: 127.0.0.1
port: %d
readOnlyPort: 0
healthzPort: 0
failCgroupV1: false
cgroupDriver: cgroupfs
cgroupRoot: /%s
containerRuntimeEndpoint: unix://%s
podLogsDir: %s
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: false}
  x509: {clientCAFile: %s}
authorization: {mode: AlwaysAllow}
failSwapOn: false
makeIPTablesUtilChains: false
evictionHard: {memory.available: "1Mi", nodefs.available: "1%%", imagefs.available: "1%%", nodefs.inodesFree: "1%%"}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
resolvConf: %s
syncFrequency: 10s
nodeStatusUpdateFrequency: 5s
`, port, c.cgroupName, c.sock, c.path("pod-logs"), p.path("ca.crt"), c.path("resolv.conf"))
	// Pods on the pod network ask the test's own nameserver
	// (startOutside), never the host's.
	if err := os.WriteFile(c.path("resolv.conf"), []byte("nameserver "+testDNS+"\n"), 0o644); err != nil {
		return err
	}
	if err := os.WriteFile(c.path("kubelet.yaml"), []byte(cfg), 0o644); err != nil {
		return err
	}
	return c.run("kubelet", filepath.Join(c.k8sBin, "kubelet"), nil,
		"--config", c.path("kubelet.yaml"), "--kubeconfig", c.path("kubelet.conf"),
		"--hostname-override", nodeName, "--root-dir", c.path("kubelet"))
}

// cgroupHierarchies lists the host's cgroup v1 hierarchies (the kubelet
// wants its root in each, named ones too), or the cgroup2 root on a pure
// v2 host.
func cgroupHierarchies() []string {
	var out []string
	b, _ := os.ReadFile("/proc/self/mountinfo")
	for _, l := range strings.Split(string(b), "\n") {
		pre, post, ok := strings.Cut(l, " - ")
		if !ok {
			continue
		}
		f, g := strings.Fields(pre), strings.Fields(post)
		if len(f) < 5 || len(g) < 3 {
			continue
		}
		switch {
		case g[0] == "cgroup":
			out = append(out, f[4])
		case g[0] == "cgroup2" && f[4] == "/sys/fs/cgroup":
			out = append(out, f[4])
		}
	}
	return out
}

// cgroupMounts lists every mounted cgroup hierarchy, v1 and v2: the
// kubelet also makes its cgroups in a hybrid host's cgroup2 hierarchy.
func cgroupMounts() []string {
	var out []string
	b, _ := os.ReadFile("/proc/self/mountinfo")
	for _, l := range strings.Split(string(b), "\n") {
		pre, post, ok := strings.Cut(l, " - ")
		if !ok {
			continue
		}
		if f, g := strings.Fields(pre), strings.Fields(post); len(f) > 4 && len(g) > 0 && (g[0] == "cgroup" || g[0] == "cgroup2") {
			out = append(out, f[4])
		}
	}
	return out
}

// run starts a daemon of the cluster with its output in NAME.log.
func (c *cluster) run(name, bin string, env []string, args ...string) error {
	logf, err := os.OpenFile(c.path(name+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer logf.Close()
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	p := &proc{name: name, cmd: cmd, done: make(chan struct{})}
	go func() { cmd.Wait(); close(p.done) }() //nolint:errcheck // its status is in its log
	c.procs = append(c.procs, p)
	return nil
}

// stop ends the daemon: SIGTERM, then SIGKILL after 20 seconds.
func (p *proc) stop() {
	p.cmd.Process.Signal(syscall.SIGTERM) //nolint:errcheck // may be gone
	select {
	case <-p.done:
	case <-time.After(20 * time.Second):
		syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL) //nolint:errcheck // stuck
		<-p.done
	}
}

// kubectl runs kubectl against the cluster as its administrator.
func (c *cluster) kubectl(stdin io.Reader, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(c.k8sBin, "kubectl"), append([]string{"--kubeconfig", c.kubeconfig}, args...)...)
	var out, errb bytes.Buffer
	cmd.Stdin, cmd.Stdout, cmd.Stderr = stdin, &out, &errb
	if err := cmd.Run(); err != nil {
		return out.String(), fmt.Errorf("kubectl %s: %w: %s%s", strings.Join(args, " "), err, out.String(), errb.String())
	}
	return out.String(), nil
}

// waitKubectl runs kubectl until ok accepts its trimmed output.
func (c *cluster) waitKubectl(d time.Duration, ok func(string) bool, args ...string) error {
	var last string
	for deadline := time.Now().Add(d); time.Now().Before(deadline); time.Sleep(time.Second) {
		out, err := c.kubectl(nil, args...)
		if err == nil && ok(strings.TrimSpace(out)) {
			return nil
		}
		last = strings.TrimSpace(out)
		if err != nil {
			last = err.Error()
		}
	}
	return fmt.Errorf("kubectl %s: not reached in %s; last: %s", strings.Join(args, " "), d, last)
}

func (c *cluster) ctr(args ...string) (string, error) {
	out, err := exec.Command(filepath.Join(c.bin, "ctr"), append([]string{"-a", c.sock, "-n", "k8s.io"}, args...)...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("ctr %s: %w: %s", strings.Join(args, " "), err, out)
	}
	return string(out), nil
}

func (c *cluster) crictl(args ...string) (string, error) {
	ep := "unix://" + c.sock
	out, err := exec.Command(filepath.Join(c.bin, "crictl"), append([]string{"--config", os.DevNull, "-r", ep, "-i", ep, "-t", "60s"}, args...)...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("crictl %s: %w: %s", strings.Join(args, " "), err, out)
	}
	return string(out), nil
}

// stop removes every pod, stops the daemons and puts the host back as it
// was. It returns what it could not remove.
func (c *cluster) stop() error {
	var errs []error
	if c.kubeconfig != "" && c.running("kubelet") && c.running("kube-apiserver") {
		if _, err := c.kubectl(nil, "delete", "pods", "--all", "--all-namespaces", "--grace-period=1", "--timeout=90s"); err != nil {
			errs = append(errs, err)
		}
	}
	c.stopProc("kubelet")
	if c.running("containerd") {
		c.crictl("rmp", "-af") //nolint:errcheck // best effort; leftovers are checked below
	}
	c.stopProc("containerd")
	for _, p := range processesMentioning(c.dir, c.procs) {
		syscall.Kill(p, syscall.SIGKILL) //nolint:errcheck // cleanup
	}
	for i := len(c.procs) - 1; i >= 0; i-- {
		c.procs[i].stop()
	}
	c.procs = nil
	time.Sleep(time.Second)
	unmountBelow(c.dir)
	if c.cgroupName != "" {
		for _, h := range cgroupMounts() {
			if err := removeCgroupTree(filepath.Join(h, c.cgroupName)); err != nil {
				errs = append(errs, err)
			}
		}
	}
	for k, v := range c.sysctls {
		if err := os.WriteFile("/proc/sys/"+k, []byte(v), 0o644); err != nil {
			errs = append(errs, fmt.Errorf("restore sysctl %s: %w", k, err))
		}
	}
	errs = append(errs, c.removeLogLinks())
	errs = append(errs, removePodNetwork())
	if left := c.leftovers(); len(left) > 0 {
		errs = append(errs, fmt.Errorf("left on the host:\n%s", strings.Join(left, "\n")))
	}
	if os.Getenv("HUTCH_K8S_KEEP") != "" {
		fmt.Fprintf(os.Stderr, "logs kept in %s\n", c.dir)
	} else if err := os.RemoveAll(c.dir); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

func (c *cluster) running(name string) bool {
	return slices.ContainsFunc(c.procs, func(p *proc) bool { return p.name == name })
}

// leftovers lists what of the cluster remains on the host.
func (c *cluster) leftovers() []string {
	var left []string
	for _, p := range processesMentioning(c.dir, nil) {
		left = append(left, "process "+strconv.Itoa(p))
	}
	for _, m := range mountsBelow(c.dir) {
		left = append(left, "mount "+m)
	}
	for _, h := range cgroupMounts() {
		if _, err := os.Stat(filepath.Join(h, c.cgroupName)); err == nil && c.cgroupName != "" {
			left = append(left, "cgroup "+filepath.Join(h, c.cgroupName))
		}
	}
	for k, v := range c.sysctls {
		if b, _ := os.ReadFile("/proc/sys/" + k); strings.TrimSpace(string(b)) != v {
			left = append(left, fmt.Sprintf("sysctl %s = %s, was %s", k, strings.TrimSpace(string(b)), v))
		}
	}
	for _, l := range podNetworkLinks() {
		left = append(left, "link "+l)
	}
	return left
}

// removeLogLinks removes the /var/log/containers links the kubelet made
// (and the directory, if it made that too).
func (c *cluster) removeLogLinks() error {
	ents, err := os.ReadDir("/var/log/containers")
	if err != nil {
		return nil
	}
	var errs []error
	for _, e := range ents {
		p := filepath.Join("/var/log/containers", e.Name())
		target, err := os.Readlink(p)
		if slices.Contains(c.logLinksBefore, e.Name()) || err != nil || !strings.HasPrefix(target, c.dir) {
			continue
		}
		errs = append(errs, os.Remove(p))
	}
	if c.logDirCreated {
		if ents, _ := os.ReadDir("/var/log/containers"); len(ents) == 0 {
			errs = append(errs, os.Remove("/var/log/containers"))
		}
	}
	return errors.Join(errs...)
}

// processesMentioning lists processes whose command line names s, except
// this one and the given daemons.
func processesMentioning(s string, except []*proc) []int {
	var out []int
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		pid, _ := strconv.Atoi(filepath.Base(filepath.Dir(p)))
		if pid == os.Getpid() || slices.ContainsFunc(except, func(d *proc) bool { return d.cmd.Process.Pid == pid }) {
			continue
		}
		if b, err := os.ReadFile(p); err == nil && bytes.Contains(b, []byte(s)) {
			out = append(out, pid)
		}
	}
	return out
}

// mountsBelow lists mount points at or below dir, deepest first.
func mountsBelow(dir string) []string {
	b, _ := os.ReadFile("/proc/self/mountinfo")
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		f := strings.Fields(l)
		if len(f) > 4 && strings.HasPrefix(f[4], dir) {
			out = append(out, f[4])
		}
	}
	sort.Slice(out, func(i, j int) bool { return len(out[i]) > len(out[j]) })
	return out
}

func unmountBelow(dir string) {
	for i := 0; i < 3; i++ {
		for _, m := range mountsBelow(dir) {
			syscall.Unmount(m, syscall.MNT_DETACH) //nolint:errcheck // cleanup; leftovers are checked
		}
	}
}

// removeCgroupTree removes a cgroup and its descendants, deepest first.
func removeCgroupTree(root string) error {
	if _, err := os.Stat(root); err != nil {
		return nil
	}
	var dirs []string
	filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error { //nolint:errcheck // best effort
		if err == nil && d.IsDir() {
			dirs = append(dirs, p)
		}
		return nil
	})
	var err error
	for i := len(dirs) - 1; i >= 0; i-- {
		for try := 0; ; try++ {
			if err = syscall.Rmdir(dirs[i]); err == nil || os.IsNotExist(err) || try == 50 {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	if err != nil {
		return fmt.Errorf("remove cgroup %s: %w", root, err)
	}
	return nil
}

// podNetworkLinks lists host interfaces that hold an address of the pod
// network (ptp's host-side veths).
func podNetworkLinks() []string {
	_, subnet, _ := net.ParseCIDR(podSubnet)
	ifs, _ := net.Interfaces()
	var out []string
	for _, i := range ifs {
		addrs, _ := i.Addrs()
		for _, a := range addrs {
			if ipn, ok := a.(*net.IPNet); ok && subnet.Contains(ipn.IP) {
				out = append(out, i.Name)
				break
			}
		}
	}
	return out
}

// removePodNetwork deletes veths the CNI plugin left (a pod removed while
// its network was being set up).
func removePodNetwork() error {
	var errs []error
	for _, l := range podNetworkLinks() {
		if out, err := exec.Command("ip", "link", "del", l).CombinedOutput(); err != nil {
			errs = append(errs, fmt.Errorf("ip link del %s: %w: %s", l, err, out))
		}
	}
	return errors.Join(errs...)
}

// freePorts returns n distinct free TCP ports on loopback.
func freePorts(n int) ([]int, error) {
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	var ports []int
	for i := 0; i < n; i++ {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// waitHTTP polls url until it answers 200.
func waitHTTP(url string, tc *tls.Config, d time.Duration) error {
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: tc}}
	var last error
	for deadline := time.Now().Add(d); time.Now().Before(deadline); time.Sleep(500 * time.Millisecond) {
		resp, err := client.Get(url)
		if err != nil {
			last = err
			continue
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			return nil
		}
		last = fmt.Errorf("%s: %s", resp.Status, body)
	}
	return fmt.Errorf("%s not ready in %s: %w", url, d, last)
}
