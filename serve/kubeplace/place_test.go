package kubeplace

import (
	"bytes"
	"encoding/json"
	"slices"
	"testing"
	"time"

	"hutch.dev/hutch/engine"
	"hutch.dev/hutch/serve/kube"
	"hutch.dev/hutch/serve/placement"
)

func testKubeConfig(t *testing.T) *Config {
	t.Helper()
	kc := &Config{Client: &kube.Client{}, Templates: map[string]string{"base": "localhost/hutch/busybox:latest"}}
	if err := checkConfig(kc); err != nil {
		t.Fatal(err)
	}
	return kc
}

func TestRenderPod(t *testing.T) {
	kc := testKubeConfig(t)
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	id := "0123456789abcdef0123456789abcdef"
	p, err := renderPod(kc, kubeSandbox{
		ID: id, Tenant: "acme", Template: "base", Image: "localhost/hutch/busybox:latest",
		Metadata: map[string]string{"run": "r1", "weird key/with=chars": "v"},
		Env:      map[string]string{"B": "2", "A": "1"}, CPUs: 1.5, Memory: 512 << 20,
		Network: "none", Private: true, Timeout: 30 * time.Second, Now: now,
	})
	if err != nil {
		t.Fatal(err)
	}
	// What the cluster gets, as JSON.
	b, _ := json.Marshal(p)
	var pod map[string]any
	json.Unmarshal(b, &pod) //nolint:errcheck // just marshalled
	spec := pod["spec"].(map[string]any)
	if spec["runtimeClassName"] != "hutch" || spec["restartPolicy"] != "Never" || spec["automountServiceAccountToken"] != false || spec["enableServiceLinks"] != false {
		t.Errorf("pod spec %v: want runtimeClassName hutch, restartPolicy Never, no service account token, no service links", spec)
	}
	c := p.Spec.Containers[0]
	if !slices.Equal(c.Command, []string{"/.hutch/hutch-init"}) || c.Image != "localhost/hutch/busybox:latest" || c.ImagePullPolicy != "IfNotPresent" {
		t.Errorf("container %+v: want the agent as init of the template's image", c)
	}
	if c.Resources.Limits["cpu"] != "1500m" || c.Resources.Limits["memory"] != "536870912" || c.Resources.Requests["cpu"] != "1500m" {
		t.Errorf("resources %+v: want requests = limits = 1500m, 512 MiB", c.Resources)
	}
	if len(c.Env) != 2 || c.Env[0].Name != "A" || c.Env[1].Name != "B" {
		t.Errorf("env %+v: want A, B in order", c.Env)
	}
	if p.Metadata.Name != "hutch-"+id || p.Metadata.Labels["hutch.dev/tenant"] != "acme" || p.Metadata.Labels["hutch.dev/sandbox"] != id {
		t.Errorf("metadata %+v: want name hutch-ID, tenant and ID labels", p.Metadata)
	}
	a := p.Metadata.Annotations
	if _, held := a["dev.hutch.egress"]; held {
		t.Errorf("annotations %v: a sandbox without network needs no egress hold", a)
	}
	if a["dev.hutch.network"] != "none" || a["hutch.dev/deadline"] != "2026-01-02T03:04:35Z" {
		t.Errorf("annotations %v: want the shim's network none and the deadline 30 s on", a)
	}
	// The shim's limits inside the pod's cgroup are the pod's.
	if a["dev.hutch.cpus"] != "1.5" || a["dev.hutch.memory"] != "536870912" {
		t.Errorf("annotations %v: want the shim's cpus 1.5 and memory 536870912", a)
	}

	// Read back as the API's handlers see it.
	created := now
	p.Metadata.CreationTimestamp = &created
	p.Status.Phase = "Running"
	p.Status.ContainerStatuses = []kube.ContainerStatus{{Name: kubeContainer}}
	p.Status.ContainerStatuses[0].State.Running = &struct {
		StartedAt time.Time `json:"startedAt"`
	}{now}
	sb := podSandbox(p)
	if sb == nil {
		t.Fatal("podSandbox: nil for the server's own pod")
	}
	want := map[string]string{
		placement.LabelTenant: "acme", placement.LabelTemplate: "base", placement.LabelPrivate: "true",
		placement.MetaPrefix + "run": "r1", placement.MetaPrefix + "weird key/with=chars": "v",
	}
	for k, v := range want {
		if sb.Labels[k] != v {
			t.Errorf("label %s = %q, want %q (labels %v)", k, sb.Labels[k], v, sb.Labels)
		}
	}
	if sb.ID != id || sb.State != engine.StateRunning || sb.CPUs != 1.5 || sb.Memory != 512<<20 || sb.Network != "none" ||
		sb.Deadline == nil || !sb.Deadline.Equal(now.Add(30*time.Second)) || !sb.Created.Equal(now) {
		t.Errorf("sandbox %+v: want ID, running, 1.5 CPUs, 512 MiB, network none, created now, deadline 30 s on", sb)
	}
}

func TestPodSandboxState(t *testing.T) {
	kc := testKubeConfig(t)
	id := "00000000000000000000000000000001"
	for _, tc := range []struct {
		phase, want string
		deleting    bool
	}{
		{"Pending", engine.StateCreating, false},
		{"Running", engine.StateStopped, false}, // its container is not running
		{"Succeeded", engine.StateStopped, false},
		{"Failed", engine.StateStopped, false},
		{"Pending", engine.StateStopped, true},
	} {
		p, err := renderPod(kc, kubeSandbox{ID: id, Tenant: "t", Image: "i", Network: "open"})
		if err != nil {
			t.Fatal(err)
		}
		p.Status.Phase = tc.phase
		if tc.deleting {
			now := time.Now()
			p.Metadata.DeletionTimestamp = &now
		}
		if got := podSandbox(p).State; got != tc.want {
			t.Errorf("phase %s (deleting %v): state %s, want %s", tc.phase, tc.deleting, got, tc.want)
		}
		if _, ok := p.Metadata.Annotations["dev.hutch.network"]; ok {
			t.Errorf("an open sandbox's pod has the shim's network annotation: %v", p.Metadata.Annotations)
		}
		if p.Metadata.Annotations["dev.hutch.egress"] != "public" {
			t.Errorf("an open sandbox's pod is not held to public egress on its node: %v", p.Metadata.Annotations)
		}
	}
	// Pods that are not the server's are not sandboxes.
	for name, l := range map[string]map[string]string{
		"no labels":        nil,
		"other manager":    {kubeLabelManaged: "someone", kubeLabelID: id, kubeLabelTenant: "t"},
		"malformed ID":     {kubeLabelManaged: kubeManagedBy, kubeLabelID: "x", kubeLabelTenant: "t"},
		"no tenant":        {kubeLabelManaged: kubeManagedBy, kubeLabelID: id},
		"tenant but no ID": {kubeLabelManaged: kubeManagedBy, kubeLabelTenant: "t"},
	} {
		if sb := podSandbox(&kube.Pod{Metadata: kube.Meta{Labels: l}}); sb != nil {
			t.Errorf("%s: podSandbox = %+v, want nil", name, sb)
		}
	}
}

func TestCheckKube(t *testing.T) {
	for name, kc := range map[string]*Config{
		"no client":       {Templates: map[string]string{"base": "img"}},
		"no templates":    {Client: &kube.Client{}},
		"bad template":    {Client: &kube.Client{}, Templates: map[string]string{"Base!": "img"}},
		"empty image":     {Client: &kube.Client{}, Templates: map[string]string{"base": ""}},
		"bad pull policy": {Client: &kube.Client{}, Templates: map[string]string{"base": "img"}, PullPolicy: "Sometimes"},
	} {
		if err := checkConfig(kc); err == nil {
			t.Errorf("%s: checkConfig accepted %+v", name, kc)
		}
	}
}

func TestKubeExecArgs(t *testing.T) {
	got := kubeExecArgs(engine.ExecRequest{Args: []string{"/bin/bash", "-l", "-c", "echo hi"}, Env: []string{"A=1", "B=x y"}, Workdir: "/tmp"})
	want := []string{"/bin/sh", "-c", kubeExecScript, "hutch-exec", "2", "A=1", "B=x y", "/tmp", "/bin/bash", "-l", "-c", "echo hi"}
	if !slices.Equal(got, want) {
		t.Errorf("kubeExecArgs = %q, want %q", got, want)
	}
}

func TestPidWriter(t *testing.T) {
	var rest bytes.Buffer
	pid := make(chan int, 1)
	w := &pidWriter{next: &rest, pid: pid}
	for _, chunk := range []string{"hutch-p", "id 42\nerr", "or 1\n"} {
		if n, err := w.Write([]byte(chunk)); err != nil || n != len(chunk) {
			t.Fatalf("Write(%q) = %d, %v", chunk, n, err)
		}
	}
	if got := <-pid; got != 42 {
		t.Errorf("pid %d, want 42", got)
	}
	if rest.String() != "error 1\n" {
		t.Errorf("stderr after the PID line %q, want %q", rest.String(), "error 1\n")
	}
}

// A sandbox with network runs its agent with the endpoint on, its key
// taken from the pod's Secret: the key itself is nowhere in the pod.
func TestRenderPodAgentEndpoint(t *testing.T) {
	kc := testKubeConfig(t)
	id := "0123456789abcdef0123456789abcdef"
	p, err := renderPod(kc, kubeSandbox{ID: id, Tenant: "acme", Image: "img", Network: "open", AgentKey: true, CPUs: 1, Memory: 1 << 30})
	if err != nil {
		t.Fatal(err)
	}
	c := p.Spec.Containers[0]
	if !slices.Equal(c.Command, []string{"/.hutch/hutch-init", "listen"}) {
		t.Errorf("command %q: want the agent's listen mode", c.Command)
	}
	if len(c.Env) != 1 || c.Env[0].Name != "HUTCH_AGENT_KEY" || c.Env[0].Value != "" || c.Env[0].ValueFrom == nil ||
		*c.Env[0].ValueFrom.SecretKeyRef != (kube.KeyRef{Name: "hutch-" + id, Key: kubeAgentSecretKey}) {
		t.Errorf("env %+v: want HUTCH_AGENT_KEY from secret hutch-ID", c.Env)
	}
	if podOnAPIExec(p) {
		t.Error("a pod with the endpoint is reached through pods/exec")
	}
	p, err = renderPod(kc, kubeSandbox{ID: id, Tenant: "acme", Image: "img", Network: "none", CPUs: 1, Memory: 1 << 30})
	if err != nil {
		t.Fatal(err)
	}
	if !podOnAPIExec(p) || len(p.Spec.Containers[0].Env) != 0 {
		t.Errorf("a pod without network: command %q, env %+v; want no endpoint, no key, pods/exec", p.Spec.Containers[0].Command, p.Spec.Containers[0].Env)
	}
}
