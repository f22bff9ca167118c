package k8s

import (
	"bytes"
	"crypto/rand"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/creack/pty"
)

// A pod runs under gVisor through the shim: its output reaches kubectl
// logs, and kubectl exec (plain, with stdin, with a terminal) and kubectl
// cp work into it.
func TestRunLogsExecCp(t *testing.T) {
	t.Parallel()
	createPod(t, "basic", podYAML("basic", nil, "  containers:\n"+
		container("main", "echo hello-from-hutch; dmesg | head -n 3; exec sleep 3600", "")))
	waitPod(t, "basic", 3*time.Minute, "running", running)

	t.Run("logs", func(t *testing.T) {
		var logs string
		for i := 0; i < 20 && !strings.Contains(logs, "gVisor"); i++ {
			logs = kubectl(t, "logs", "basic")
			time.Sleep(500 * time.Millisecond)
		}
		// gVisor's kernel log says what kernel the pod runs on.
		if !strings.Contains(logs, "hello-from-hutch") || !strings.Contains(logs, "gVisor") {
			t.Fatalf("kubectl logs: want hello-from-hutch and gVisor's kernel log, got %q", logs)
		}
	})

	t.Run("exec", func(t *testing.T) {
		out, err := cl.kubectl(nil, "exec", "basic", "--", "sh", "-c", "echo $((6*7)); exit 3")
		if exitCode(err) != 3 || strings.TrimSpace(out) != "42" {
			t.Fatalf("kubectl exec: want 42 and exit 3, got %q, %v", out, err)
		}
		out, err = cl.kubectl(strings.NewReader("sandboxed\n"), "exec", "-i", "basic", "--", "tr", "a-z", "A-Z")
		if err != nil || strings.TrimSpace(out) != "SANDBOXED" {
			t.Fatalf("kubectl exec -i: want SANDBOXED, got %q, %v", out, err)
		}
	})

	t.Run("exec-tty", func(t *testing.T) {
		cmd := exec.Command(filepath.Join(cl.k8sBin, "kubectl"), "--kubeconfig", cl.kubeconfig, "exec", "-it", "basic", "--", "sh")
		ptmx, err := pty.StartWithSize(cmd, &pty.Winsize{Rows: 33, Cols: 101})
		if err != nil {
			t.Fatal(err)
		}
		defer ptmx.Close()
		var out bytes.Buffer
		done := make(chan struct{})
		go func() { io.Copy(&out, ptmx); close(done) }() //nolint:errcheck // ends with EIO when kubectl exits
		time.Sleep(2 * time.Second)
		io.WriteString(ptmx, "test -t 0 && test -t 1 && echo on-a-\"\"terminal; stty size; echo MARK$((40+2))\n") //nolint:errcheck // checked by the output
		time.Sleep(2 * time.Second)
		io.WriteString(ptmx, "exit 7\n") //nolint:errcheck // checked by the exit status
		werr := make(chan error, 1)
		go func() { werr <- cmd.Wait() }()
		select {
		case err = <-werr:
		case <-time.After(time.Minute):
			cmd.Process.Kill() //nolint:errcheck // stuck
			t.Fatalf("kubectl exec -it did not end; output %q", out.String())
		}
		<-done
		o := out.String()
		if !strings.Contains(o, "on-a-terminal") || !strings.Contains(o, "33 101") || !strings.Contains(o, "MARK42") || exitCode(err) != 7 {
			t.Fatalf("kubectl exec -it: want a terminal of 33x101, MARK42 and exit 7, got %q, %v", o, err)
		}
	})

	t.Run("cp", func(t *testing.T) {
		dir := t.TempDir()
		data := make([]byte, 256<<10)
		rand.Read(data) //nolint:errcheck // never fails
		in := filepath.Join(dir, "in.bin")
		if err := os.WriteFile(in, data, 0o644); err != nil {
			t.Fatal(err)
		}
		kubectl(t, "cp", in, "basic:/tmp/in.bin")
		if out := kubectl(t, "exec", "basic", "--", "wc", "-c", "/tmp/in.bin"); !strings.HasPrefix(strings.TrimSpace(out), fmt.Sprint(len(data))) {
			t.Fatalf("in the pod: %q, want %d bytes", out, len(data))
		}
		kubectl(t, "exec", "basic", "--", "sh", "-c", "cp /tmp/in.bin /tmp/back.bin")
		back := filepath.Join(dir, "back.bin")
		kubectl(t, "cp", "basic:/tmp/back.bin", back)
		got, err := os.ReadFile(back)
		if err != nil || !bytes.Equal(got, data) {
			t.Fatalf("kubectl cp round trip: %d bytes back (%v), want the %d sent", len(got), err, len(data))
		}
	})
}

// A container that allocates past its memory limit is OOM-killed, and the
// pod's status says so.
func TestOOMKilled(t *testing.T) {
	t.Parallel()
	createPod(t, "oom", podYAML("oom", nil, "  restartPolicy: Never\n  containers:\n"+
		container("bomb", "x=0123456789abcdef; while true; do x=$x$x; done",
			"    resources:\n      limits: {memory: 128Mi}")))
	p := waitPod(t, "oom", 3*time.Minute, "terminated", func(p pod) bool { return p.container("bomb").State.Terminated != nil })
	if r := p.container("bomb").State.Terminated.Reason; r != "OOMKilled" {
		t.Fatalf("terminated with reason %q, want OOMKilled; events:\n%s", r, events(t, "oom"))
	}
}

// A pod whose CPU limit is below the operator's default CPUs runs: the
// pod's limit binds its sandbox (a sandbox cgroup asking for more than
// the pod's is refused by the kernel).
func TestSmallCPULimit(t *testing.T) {
	t.Parallel()
	createPod(t, "smallcpu", podYAML("smallcpu", nil, "  containers:\n"+
		container("main", "echo up; exec sleep 3600", "    resources:\n      limits: {cpu: 250m, memory: 256Mi}")))
	waitPod(t, "smallcpu", 3*time.Minute, "running", running)
	if out := kubectl(t, "exec", "smallcpu", "--", "echo", "inside"); strings.TrimSpace(out) != "inside" {
		t.Fatalf("kubectl exec in a pod limited to 250m CPU: %q", out)
	}
}

// A crashing container is restarted as its restart policy says, and its
// previous run's logs stay readable.
func TestRestartPolicy(t *testing.T) {
	t.Parallel()
	createPod(t, "crash", podYAML("crash", nil, "  restartPolicy: Always\n  containers:\n"+
		container("main", "echo run-$(date +%s); sleep 1; exit 4", "")))
	p := waitPod(t, "crash", 3*time.Minute, "restarted twice", func(p pod) bool { return p.container("main").RestartCount >= 2 })
	if lt := p.container("main").LastState.Terminated; lt == nil || lt.ExitCode != 4 {
		t.Fatalf("last state %+v, want terminated with exit code 4", p.container("main").LastState)
	}
	if out := kubectl(t, "logs", "crash", "--previous"); !strings.Contains(out, "run-") {
		t.Fatalf("kubectl logs --previous: %q", out)
	}
}

// Exec probes run in the sandbox: readiness waits for the file the
// container makes, and a failing liveness probe restarts its container.
func TestProbes(t *testing.T) {
	t.Parallel()
	createPod(t, "probes", podYAML("probes", nil, "  containers:\n"+
		container("ready", "sleep 5; touch /tmp/ready; exec sleep 3600",
			"    readinessProbe:\n      exec: {command: [cat, /tmp/ready]}\n      periodSeconds: 1")+
		container("live", "touch /tmp/alive; sleep 3; rm /tmp/alive; exec sleep 3600",
			"    livenessProbe:\n      exec: {command: [cat, /tmp/alive]}\n      periodSeconds: 1\n      failureThreshold: 2")))
	p := waitPod(t, "probes", 3*time.Minute, "ready, with a liveness restart", func(p pod) bool {
		return p.container("ready").Ready && p.container("live").RestartCount >= 1
	})
	started := p.container("ready").State.Running
	if started == nil {
		t.Fatalf("container ready not running: %+v", p.container("ready"))
	}
	// Ready only once the file exists: at least ~5 s after its start.
	var readyAt time.Time
	for _, c := range p.Status.Conditions {
		if c.Type == "ContainersReady" {
			readyAt = c.LastTransitionTime
		}
	}
	if readyAt.Sub(started.StartedAt) < 4*time.Second {
		t.Fatalf("ready at %s, %s after its start: the readiness probe did not wait for /tmp/ready", readyAt, readyAt.Sub(started.StartedAt))
	}
	if ev := events(t, "probes"); !strings.Contains(ev, "Liveness probe failed") {
		t.Fatalf("no liveness failure in the events:\n%s", ev)
	}
}

// The containers of a pod share one sandbox and its localhost; the pod's
// address on the cluster network (CNI) reaches it too, for the kubelet's
// HTTP probe and from the node.
func TestMultiContainerLocalhost(t *testing.T) {
	t.Parallel()
	createPod(t, "duo", podYAML("duo", nil, "  containers:\n"+
		container("server", "mkdir -p /www && echo shared-localhost > /www/index.html && exec httpd -f -p 8080 -h /www",
			"    readinessProbe:\n      httpGet: {port: 8080, path: /index.html}\n      periodSeconds: 1")+
		container("client", "exec sleep 3600", "")))
	p := waitPod(t, "duo", 3*time.Minute, "ready", pod.ready)
	out, err := cl.kubectl(nil, "exec", "duo", "-c", "client", "--", "wget", "-qO-", "http://127.0.0.1:8080/index.html")
	if err != nil || strings.TrimSpace(out) != "shared-localhost" {
		t.Fatalf("client to server over localhost: %q, %v", out, err)
	}
	if !strings.HasPrefix(p.Status.PodIP, strings.TrimSuffix(podGateway, "1")) {
		t.Fatalf("pod IP %q, want one of the CNI network %s", p.Status.PodIP, podSubnet)
	}
	resp, err := (&http.Client{Timeout: 10 * time.Second}).Get("http://" + net.JoinHostPort(p.Status.PodIP, "8080") + "/index.html")
	if err != nil {
		t.Fatalf("from the node to the pod's IP: %v", err)
	}
	defer resp.Body.Close()
	if b, _ := io.ReadAll(resp.Body); strings.TrimSpace(string(b)) != "shared-localhost" {
		t.Fatalf("from the node to the pod's IP: %q", b)
	}
}
