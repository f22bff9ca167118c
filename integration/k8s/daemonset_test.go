package k8s

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"hutch.dev/hutch/agent/agentnet"
	"hutch.dev/hutch/kubenode"
)

// installerImage is the name `make installer-image` gives the installer.
const installerImage = "localhost/hutch/installer:latest"

// The operator's path with deploy/kubernetes/daemonset.yaml: on a node
// without hutch, the installer DaemonSet's pod (under runc, the default
// runtime) installs hutch where install-node.sh's variables say, restarts
// containerd through the host's init, and labels the node, after which a
// pod with runtimeClassName hutch runs under gVisor. uninstall.yaml then
// leaves the node as it was before the install.
func TestDaemonSetInstallsNode(t *testing.T) {
	image := filepath.Join(cl.bin, "images", "hutch-installer.tar")
	if _, err := os.Stat(image); err != nil {
		t.Fatalf("the installer image is not built (make installer-image): %v", err)
	}
	if _, err := exec.LookPath("runc"); err != nil {
		t.Fatalf("runc, the default runtime the installer runs under, is not installed (apt-get install runc): %v", err)
	}
	if _, err := os.Stat(filepath.Join(cl.bin, "containerd-shim-runc-v2")); err != nil {
		t.Fatalf("runc's containerd shim is not built (make k8s-test builds it): %v", err)
	}
	if _, err := cl.ctr("images", "import", image); err != nil {
		t.Fatal(err)
	}
	server, err := cl.kubectl(nil, "config", "view", "-o", "jsonpath={.clusters[0].cluster.server}")
	if err != nil {
		t.Fatal(err)
	}

	// A node without hutch: the harness's own install removed, containerd
	// restarted without the handler, the label gone.
	node := cl.path("node")
	uninstall := exec.Command("sh", filepath.Join(cl.repo, "deploy", "kubernetes", "install-node.sh"), "uninstall")
	uninstall.Env = append(os.Environ(), cl.nodeEnv()...)
	if out, err := uninstall.CombinedOutput(); err != nil {
		t.Fatalf("install-node.sh uninstall: %v: %s", err, out)
	}
	t.Cleanup(func() { cl.reinstallNode(t) })
	kubectl(t, "label", "node", nodeName, "hutch.dev/runtime-")
	cl.restartContainerd(t)
	waitHandler(t, false)
	before := tree(t, node)

	// The installer DaemonSet, its variables pointing into the test's node
	// directory below the host's /, its restart command stopping the test's
	// containerd (which the test then starts again, as the host's init
	// would).
	sup := cl.superviseContainerd()
	defer sup.stop(t)
	vars := func(pid int) map[string]string {
		return map[string]string{
			"HUTCH_KUBE_API":     server,
			"PREFIX":             filepath.Join(node, "usr", "local"),
			"HUTCH_ETC":          filepath.Join(node, "etc", "hutch"),
			"CONTAINERD_CONF_D":  filepath.Join(node, "etc", "containerd", "conf.d"),
			"CONTAINERD_CONFIG":  cl.path("containerd.toml"),
			"CONTAINERD_RESTART": fmt.Sprintf("kill -TERM %d", pid),
			// The host's PID 1 may be out of reach here; this test runs in
			// the host's namespaces.
			"HOST_PID": strconv.Itoa(os.Getpid()),
		}
	}
	t.Cleanup(func() {
		cl.kubectl(nil, "delete", "--ignore-not-found", "--timeout=90s", //nolint:errcheck // best effort; the cluster's stop checks the host
			"-f", filepath.Join(cl.repo, "deploy", "kubernetes", "uninstall.yaml"),
			"-f", filepath.Join(cl.repo, "deploy", "kubernetes", "daemonset.yaml"))
	})
	// With the Secret hutch-node-key, the installer's pod then runs the
	// node service.
	nodeKey := make([]byte, 32)
	rand.Read(nodeKey) //nolint:errcheck // never fails
	keyFile := filepath.Join(t.TempDir(), "node.key")
	if err := os.WriteFile(keyFile, []byte(hex.EncodeToString(nodeKey)), 0o600); err != nil {
		t.Fatal(err)
	}
	kubectl(t, "create", "namespace", "hutch-system")
	kubectl(t, "-n", "hutch-system", "create", "secret", "generic", "hutch-node-key", "--from-file=key="+keyFile)
	install := vars(sup.pid())
	install["CONTAINERD_SOCKET"] = cl.sock
	install["CHECKPOINT_DIR"] = cl.checkpoints
	applyDeploy(t, "daemonset.yaml", install)
	if out, err := cl.kubectl(nil, "-n", "hutch-system", "rollout", "status", "daemonset/hutch-installer", "--timeout=170s"); err != nil {
		t.Fatalf("installer not ready: %v\n%s\ninstaller log:\n%s", err, out, installerLog(t, "hutch-installer"))
	}
	if sup.restarts() == 0 {
		t.Fatalf("the installer did not restart containerd; its log:\n%s", installerLog(t, "hutch-installer"))
	}
	if l := kubectl(t, "get", "node", nodeName, "-o", `jsonpath={.metadata.labels.hutch\.dev/runtime}`); l != "true" {
		t.Fatalf("node label hutch.dev/runtime = %q after the install, want true", l)
	}
	waitHandler(t, true)

	// The files are where docs/kubernetes.md says, the binaries those of
	// the image; the operator's policy file is kept.
	for _, f := range []string{"containerd-shim-hutch-v1", "runsc", "hutch-init"} {
		got, err := os.ReadFile(filepath.Join(node, "usr", "local", "bin", f))
		if err != nil {
			t.Fatalf("installed %s: %v", f, err)
		}
		want, err := os.ReadFile(filepath.Join(cl.bin, f))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("installed %s differs from %s (an installer image older than the binaries? make installer-image)", f, filepath.Join(cl.bin, f))
		}
	}
	dropin, err := os.ReadFile(filepath.Join(node, "etc", "containerd", "conf.d", "hutch.toml"))
	if err != nil || !bytes.Contains(dropin, []byte(`runtimes.hutch]`)) || !bytes.Contains(dropin, []byte(cl.shimConfig)) {
		t.Fatalf("containerd drop-in: %v\n%s", err, dropin)
	}
	if policy, err := os.ReadFile(cl.shimConfig); err != nil || !bytes.Contains(policy, []byte(cl.path("runsc"))) {
		t.Fatalf("the operator's policy file was not kept: %v\n%s", err, policy)
	}

	// The installer itself runs under runc; a pod of the RuntimeClass runs
	// under gVisor.
	if out := kubectl(t, "-n", "hutch-system", "get", "pods", "-o", "jsonpath={.items[*].spec.runtimeClassName}"); strings.TrimSpace(out) != "" {
		t.Fatalf("the installer pod has runtimeClassName %q, want the default runtime", out)
	}
	createPod(t, "after-daemonset", podYAML("after-daemonset", nil, "  containers:\n"+
		container("main", "dmesg; exec sleep 3600", "")))
	waitPod(t, "after-daemonset", 3*time.Minute, "running", running)
	if out := kubectl(t, "exec", "after-daemonset", "--", "dmesg"); !strings.Contains(out, "gVisor") {
		t.Fatalf("dmesg in the pod: want gVisor's kernel log, got %q", out)
	}

	// The node service answers only its key's holder, and checkpoints
	// the pod through the node's containerd into the node's directory.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	name := strings.Repeat("5a", 16)
	bad := &kubenode.Client{Key: make([]byte, 32), Timeout: 30 * time.Second}
	if err := bad.Remove(ctx, "127.0.0.1", kubenode.RemoveRequest{Namespace: "default", Name: name}); !errors.Is(err, agentnet.ErrAuth) {
		t.Fatalf("the node service with another key: %v, want an authentication failure", err)
	}
	nodes := &kubenode.Client{Key: nodeKey, Timeout: time.Minute}
	uid := kubectl(t, "get", "pod", "after-daemonset", "-o", "jsonpath={.metadata.uid}")
	res, err := nodes.Checkpoint(ctx, "127.0.0.1", kubenode.CheckpointRequest{Namespace: "default", Pod: "after-daemonset", PodUID: uid, Name: name})
	if err != nil {
		t.Fatalf("checkpoint through the DaemonSet's node service: %v\ninstaller log:\n%s", err, installerLog(t, "hutch-installer"))
	}
	if _, err := os.Stat(filepath.Join(cl.checkpoints, "default", name, "checkpoint.img")); err != nil {
		t.Fatalf("the checkpoint is not in the node's directory: %v", err)
	}
	t.Logf("checkpoint of a pod through the DaemonSet's node service: %d bytes in %s", res.Bytes, res.Duration)
	if err := nodes.Remove(ctx, "127.0.0.1", kubenode.RemoveRequest{Namespace: "default", Name: name}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(cl.checkpoints, "default", name)); !os.IsNotExist(err) {
		t.Fatalf("the removed checkpoint is still there: %v", err)
	}
	kubectl(t, "delete", "pod", "after-daemonset", "--grace-period=1", "--timeout=90s")

	// Uninstall: the DaemonSet goes, the uninstaller runs on the node; the
	// node is then as it was before the install.
	kubectl(t, "-n", "hutch-system", "delete", "daemonset", "hutch-installer", "--timeout=90s")
	applyDeploy(t, "uninstall.yaml", vars(sup.pid()))
	restarts := sup.restarts()
	if out, err := cl.kubectl(nil, "-n", "hutch-system", "rollout", "status", "daemonset/hutch-uninstaller", "--timeout=170s"); err != nil {
		t.Fatalf("uninstaller not ready: %v\n%s\nuninstaller log:\n%s", err, out, installerLog(t, "hutch-uninstaller"))
	}
	if sup.restarts() == restarts {
		t.Fatalf("the uninstaller did not restart containerd; its log:\n%s", installerLog(t, "hutch-uninstaller"))
	}
	waitHandler(t, false)
	if l, err := cl.kubectl(nil, "get", "node", nodeName, "-o", `jsonpath={.metadata.labels.hutch\.dev/runtime}`); err != nil || l != "" {
		t.Fatalf("node label hutch.dev/runtime = %q (%v) after the uninstall, want none", l, err)
	}
	kubectl(t, "delete", "--ignore-not-found", "--timeout=90s",
		"-f", filepath.Join(cl.repo, "deploy", "kubernetes", "uninstall.yaml"),
		"-f", filepath.Join(cl.repo, "deploy", "kubernetes", "daemonset.yaml"))
	if after := tree(t, node); !slices.Equal(after, before) {
		t.Fatalf("the node after the uninstall differs from before the install:\nbefore:\n%s\nafter:\n%s",
			strings.Join(before, "\n"), strings.Join(after, "\n"))
	}
}

// nodeEnv is install-node.sh's environment for the test's node.
func (c *cluster) nodeEnv() []string {
	return []string{
		"BIN_DIR=" + c.bin,
		"PREFIX=" + c.path("node", "usr", "local"),
		"HUTCH_ETC=" + c.path("node", "etc", "hutch"),
		"CONTAINERD_CONF_D=" + c.path("node", "etc", "containerd", "conf.d"),
	}
}

// restartContainerd stops and starts the test's containerd.
func (c *cluster) restartContainerd(t *testing.T) {
	t.Helper()
	c.stopProc("containerd")
	if err := c.startContainerd(); err != nil {
		t.Fatal(err)
	}
}

// reinstallNode puts the harness's own install back for the other tests.
func (c *cluster) reinstallNode(t *testing.T) {
	if err := c.setUpNode(); err != nil {
		t.Errorf("reinstalling the node: %v", err)
		return
	}
	c.restartContainerd(t)
	if _, err := c.kubectl(nil, "label", "node", nodeName, "hutch.dev/runtime=true", "--overwrite"); err != nil {
		t.Error(err)
	}
	waitHandler(t, true)
}

// supervisor starts the test's containerd again each time it exits, as a
// host's init restarts the containerd service.
type supervisor struct {
	c       *cluster
	stopped chan struct{}
	done    chan struct{}
	// mu guards cur (containerd's pid) and n (the restarts so far).
	mu     sync.Mutex
	cur, n int
}

func (c *cluster) superviseContainerd() *supervisor {
	s := &supervisor{c: c, stopped: make(chan struct{}), done: make(chan struct{})}
	s.cur = c.containerd().cmd.Process.Pid
	go func() {
		defer close(s.done)
		for {
			p := c.containerd()
			select {
			case <-s.stopped:
				return
			case <-p.done:
			}
			c.stopProc("containerd")
			if err := c.startContainerd(); err != nil {
				fmt.Fprintln(os.Stderr, "restarting containerd:", err)
				return
			}
			s.mu.Lock()
			s.cur, s.n = c.containerd().cmd.Process.Pid, s.n+1
			s.mu.Unlock()
		}
	}()
	return s
}

func (s *supervisor) pid() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cur
}

func (s *supervisor) restarts() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.n
}

func (s *supervisor) stop(t *testing.T) {
	select {
	case <-s.stopped:
		return
	default:
	}
	close(s.stopped)
	<-s.done
	if !s.c.running("containerd") {
		t.Error("containerd is not running")
	}
}

// containerd is the running containerd daemon.
func (c *cluster) containerd() *proc {
	for _, p := range c.procs {
		if p.name == "containerd" {
			return p
		}
	}
	return nil
}

// applyDeploy applies a file of deploy/kubernetes with its installer's
// environment variables set to vars.
func applyDeploy(t *testing.T, file string, vars map[string]string) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(cl.repo, "deploy", "kubernetes", file))
	if err != nil {
		t.Fatal(err)
	}
	y := string(b)
	for k, v := range vars {
		re := regexp.MustCompile(`(?m)^\s*- name: ` + regexp.QuoteMeta(k) + `\n\s*value: (.*)$`)
		m := re.FindStringSubmatchIndex(y)
		if m == nil {
			t.Fatalf("%s has no variable %s", file, k)
		}
		y = y[:m[2]] + strconv.Quote(v) + y[m[3]:]
	}
	if _, err := cl.kubectl(strings.NewReader(y), "apply", "-f", "-"); err != nil {
		t.Fatal(err)
	}
}

// installerLog is the log of the installer DaemonSet's pod.
func installerLog(t *testing.T, ds string) string {
	out, err := cl.kubectl(nil, "-n", "hutch-system", "logs", "daemonset/"+ds)
	if err != nil {
		return err.Error()
	}
	return out
}

// waitHandler waits until the node reports the runtime handler hutch (or
// no longer does).
func waitHandler(t *testing.T, present bool) {
	t.Helper()
	if err := cl.waitKubectl(2*time.Minute, func(out string) bool { return slices.Contains(strings.Fields(out), "hutch") == present },
		"get", "node", nodeName, "-o", "jsonpath={.status.runtimeHandlers[*].name}"); err != nil {
		t.Fatalf("runtime handler hutch present=%v: %v", present, err)
	}
}

// tree lists the files below dir with their modes and contents' digests.
func tree(t *testing.T, dir string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		line := fmt.Sprintf("%s %s", p, fi.Mode())
		if fi.Mode().IsRegular() {
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			line += fmt.Sprintf(" %x", sha256.Sum256(b))
		}
		out = append(out, line)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}
