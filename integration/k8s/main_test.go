package k8s

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// cl is the cluster every test uses, started once by TestMain.
var cl *cluster

func TestMain(m *testing.M) {
	if os.Getenv("HUTCH_K8S") == "" {
		fmt.Println("skipping the Kubernetes end-to-end tests: run them with `make k8s-test` (HUTCH_K8S=1, as root)")
		os.Exit(0)
	}
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "the Kubernetes end-to-end tests need root")
		os.Exit(1)
	}
	start := time.Now()
	c, err := startCluster()
	code := 1
	if err != nil {
		fmt.Fprintln(os.Stderr, "starting the cluster:", err)
	} else {
		fmt.Printf("cluster up in %s\n", time.Since(start).Round(time.Second))
		cl = c
		code = m.Run()
	}
	if c != nil {
		if err != nil || code != 0 {
			c.dumpLogs()
		}
		if err := c.stop(); err != nil {
			fmt.Fprintln(os.Stderr, "stopping the cluster:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// dumpLogs prints the end of each daemon's log, for a failed run.
func (c *cluster) dumpLogs() {
	for _, n := range []string{"kubelet", "containerd", "kube-apiserver"} {
		b, _ := os.ReadFile(c.path(n + ".log"))
		lines := strings.Split(string(b), "\n")
		if len(lines) > 40 {
			lines = lines[len(lines)-40:]
		}
		fmt.Fprintf(os.Stderr, "--- %s.log (end)\n%s\n", n, strings.Join(lines, "\n"))
	}
}

// kubectl runs kubectl and fails the test if it fails.
func kubectl(t *testing.T, args ...string) string {
	t.Helper()
	out, err := cl.kubectl(nil, args...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// exitCode is the exit status of a failed kubectl (-1: not an exit).
func exitCode(err error) int {
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.ExitCode()
	}
	return -1
}

// container renders one busybox container running cmd with sh -c; extra
// is more of the container's YAML, indented by four spaces.
func container(name, cmd, extra string) string {
	c, _ := json.Marshal(cmd)
	s := fmt.Sprintf("  - name: %s\n    image: %s\n    imagePullPolicy: Never\n    command: [\"sh\", \"-c\", %s]\n", name, busyboxImage, c)
	if extra != "" {
		s += strings.TrimRight(extra, "\n") + "\n"
	}
	return s
}

// podYAML renders a pod with runtimeClassName hutch; spec is the rest of its
// spec (indented by two spaces), with containers from container.
func podYAML(name string, annotations map[string]string, spec string) string {
	a, _ := json.Marshal(annotations)
	if annotations == nil {
		a = []byte("{}")
	}
	return fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata:
  name: %s
  annotations: %s
spec:
  runtimeClassName: hutch
  terminationGracePeriodSeconds: 1
%s`, name, a, spec)
}

// createPod creates the pod and deletes it (waiting until it is gone) at
// the end of the test.
func createPod(t *testing.T, name, yaml string) {
	t.Helper()
	if _, err := cl.kubectl(strings.NewReader(yaml), "apply", "-f", "-"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cl.kubectl(nil, "delete", "pod", name, "--ignore-not-found", "--grace-period=1", "--timeout=90s") //nolint:errcheck // best effort; the cluster's stop checks the host
	})
}

// pod is what the tests read of a pod.
type pod struct {
	Metadata struct {
		UID string `json:"uid"`
	} `json:"metadata"`
	Status struct {
		Phase      string `json:"phase"`
		PodIP      string `json:"podIP"`
		Conditions []struct {
			Type               string    `json:"type"`
			Status             string    `json:"status"`
			LastTransitionTime time.Time `json:"lastTransitionTime"`
		} `json:"conditions"`
		ContainerStatuses []containerStatus `json:"containerStatuses"`
	} `json:"status"`
}

type containerState struct {
	Running *struct {
		StartedAt time.Time `json:"startedAt"`
	} `json:"running"`
	Waiting *struct {
		Reason  string `json:"reason"`
		Message string `json:"message"`
	} `json:"waiting"`
	Terminated *struct {
		Reason   string `json:"reason"`
		ExitCode int    `json:"exitCode"`
	} `json:"terminated"`
}

type containerStatus struct {
	Name         string         `json:"name"`
	Ready        bool           `json:"ready"`
	RestartCount int            `json:"restartCount"`
	State        containerState `json:"state"`
	LastState    containerState `json:"lastState"`
}

func (p pod) container(name string) containerStatus {
	for _, c := range p.Status.ContainerStatuses {
		if c.Name == name {
			return c
		}
	}
	return containerStatus{}
}

func (p pod) ready() bool {
	for _, c := range p.Status.Conditions {
		if c.Type == "Ready" {
			return c.Status == "True"
		}
	}
	return false
}

func getPod(t *testing.T, name string) pod {
	t.Helper()
	var p pod
	if err := json.Unmarshal([]byte(kubectl(t, "get", "pod", name, "-o", "json")), &p); err != nil {
		t.Fatal(err)
	}
	return p
}

// waitPod polls the pod until cond holds, failing the test (with the
// pod's events) after d.
func waitPod(t *testing.T, name string, d time.Duration, what string, cond func(pod) bool) pod {
	t.Helper()
	for deadline := time.Now().Add(d); ; time.Sleep(time.Second) {
		p := getPod(t, name)
		if cond(p) {
			return p
		}
		if time.Now().After(deadline) {
			t.Fatalf("pod %s: not %s within %s; status %+v\nevents:\n%s", name, what, d, p.Status, events(t, name))
		}
	}
}

func running(p pod) bool { return p.Status.Phase == "Running" }

// events returns the messages of the pod's events, one a line.
func events(t *testing.T, name string) string {
	t.Helper()
	out, _ := cl.kubectl(nil, "get", "events", "--field-selector", "involvedObject.name="+name,
		"-o", `jsonpath={range .items[*]}{.reason}: {.message}{"\n"}{end}`)
	return out
}

// waitEvent waits for an event of the pod whose message contains want.
func waitEvent(t *testing.T, name, want string, d time.Duration) {
	t.Helper()
	for deadline := time.Now().Add(d); ; time.Sleep(time.Second) {
		ev := events(t, name)
		if strings.Contains(ev, want) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("pod %s: no event with %q within %s; events:\n%s", name, want, d, ev)
		}
	}
}
