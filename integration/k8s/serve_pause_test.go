package k8s

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Pause and resume on the Kubernetes backend: hutch's node service
// checkpoints a sandbox's pod into a directory of its node, the pod goes,
// and a resume makes the pod again on that node, restored by the shim
// from the checkpoint: processes keep running, files stay, and no other
// tenant sees or resumes it. A snapshot is such a checkpoint with the
// sandbox left running, from which new sandboxes are restored.

// startNodeService runs `hutch-node serve` for the test cluster's node with
// a new key, and returns the key's file and the service's port.
func startNodeService(t *testing.T, hostIP string) (keyFile string, port int) {
	t.Helper()
	key := make([]byte, 32)
	rand.Read(key) //nolint:errcheck // never fails
	keyFile = filepath.Join(t.TempDir(), "node-key")
	if err := os.WriteFile(keyFile, []byte(hex.EncodeToString(key)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", net.JoinHostPort(hostIP, "0"))
	if err != nil {
		t.Fatal(err)
	}
	port = l.Addr().(*net.TCPAddr).Port
	l.Close()
	if err := cl.run("hutch-node", filepath.Join(cl.bin, "hutch-node"), nil, "serve", "--key-file", keyFile,
		"--listen", net.JoinHostPort(hostIP, strconv.Itoa(port)), "--containerd", cl.sock,
		"--checkpoint-dir", cl.checkpoints); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cl.stopProc("hutch-node") })
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		c, err := net.Dial("tcp", net.JoinHostPort(hostIP, strconv.Itoa(port)))
		if err == nil {
			c.Close()
			return keyFile, port
		}
		if time.Now().After(deadline) {
			b, _ := os.ReadFile(cl.path("hutch-node.log"))
			t.Fatalf("hutch-node serve did not listen: %v\n%s", err, b)
		}
	}
}

// checkpointsOf lists the checkpoint directories of namespace ns.
func checkpointsOf(t *testing.T, ns string) []string {
	t.Helper()
	ents, err := os.ReadDir(filepath.Join(cl.checkpoints, ns))
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		out = append(out, e.Name())
	}
	return out
}

func TestServePauseOnKubernetes(t *testing.T) {
	s := newKubeServe(t)
	keyA := s.tenantAdd("alpha")
	keyB := s.tenantAdd("beta")
	// Room for one pod's disk (hutch's default, 10 GiB).
	keyC := s.tenantAdd("gamma", "--max-disk", "10g")
	flags := kubeBackend("--template", "base="+busyboxImage, "--pod-cpus", "0.25", "--pod-memory", "256m")
	s.start(flags...)

	res := s.sdk("create", keyA, "")
	id, short, none := res["id"], res["short"], res["none"]
	pod := "hutch-" + id
	t.Cleanup(func() {
		cl.kubectl(nil, "delete", "pod", pod, "hutch-"+short, "hutch-"+none, "--ignore-not-found", "--grace-period=1", "--timeout=90s") //nolint:errcheck // best effort
		cl.kubectl(nil, "delete", "secret", pod, "hutch-"+none, "--ignore-not-found")                                                   //nolint:errcheck // best effort
	})
	for _, p := range []string{pod, "hutch-" + none} {
		kubectl(t, "exec", p, "--", "sh", "-c", `printf '#!/bin/sh\nexec /bin/sh "$@"\n' >/bin/bash && chmod +x /bin/bash`)
	}

	// Without the node service's key, pause says what it needs.
	if code, body := s.api("POST", "/sandboxes/"+id+"/pause", keyA, ""); code != http.StatusNotImplemented || !strings.Contains(body, "--node-key") {
		t.Errorf("pause without --node-key: %d %s, want 501 naming --node-key", code, body)
	}

	var p sandboxPod
	if err := json.Unmarshal([]byte(kubectl(t, "get", "pod", pod, "-o", "json")), &p); err != nil {
		t.Fatal(err)
	}
	hostIP := strings.TrimSpace(kubectl(t, "get", "pod", pod, "-o", "jsonpath={.status.hostIP}"))
	oldIP := p.Status.PodIP
	keyFile, port := startNodeService(t, hostIP)
	s.stop()
	s.start(append(flags, "--node-key", keyFile, "--node-port", strconv.Itoa(port))...)

	// Another tenant cannot pause it.
	if code, body := s.api("POST", "/sandboxes/"+id+"/pause", keyB, ""); code != http.StatusNotFound {
		t.Errorf("another tenant's pause: %d %s, want 404", code, body)
	}

	t0 := time.Now()
	res = s.sdk("pause", keyA, id)
	t.Logf("paused with the counter at %s (SDK step %s)", res["before"], time.Since(t0).Round(time.Millisecond))
	before, _ := strconv.Atoi(res["before"])
	waitGone(t, pod, 60*time.Second)
	if cps := checkpointsOf(t, "default"); len(cps) != 1 {
		t.Fatalf("checkpoints on the node after one pause: %v, want one", cps)
	}
	if out := kubectl(t, "get", "secret", pod, "-o", "jsonpath={.metadata.ownerReferences}"); strings.TrimSpace(out) != "" {
		t.Errorf("the paused sandbox's record is still owned (the cluster would delete it): %s", out)
	}

	// Paused, it is another tenant's to neither see, resume nor kill.
	s.sdk("intrude", keyB, id)
	if cps := checkpointsOf(t, "default"); len(cps) != 1 {
		t.Fatalf("another tenant's calls changed the checkpoints: %v", cps)
	}

	// A new server finds it paused, and resumes it.
	s.stop()
	s.start(append(flags, "--node-key", keyFile, "--node-port", strconv.Itoa(port))...)
	t0 = time.Now()
	res = s.sdk("resume", keyA, id)
	t.Logf("resumed: counter %s then %s (SDK step %s)\n%s", res["after"], res["later"], time.Since(t0).Round(time.Millisecond), res["ps"])
	if after, _ := strconv.Atoi(res["after"]); after < before {
		t.Errorf("after resume the counter is at %d, below %d where it was at the pause: the sandbox was not restored", after, before)
	}
	if err := json.Unmarshal([]byte(kubectl(t, "get", "pod", pod, "-o", "json")), &p); err != nil {
		t.Fatal(err)
	}
	t.Logf("pod address %s before the pause, %s after", oldIP, p.Status.PodIP)
	if cps := checkpointsOf(t, "default"); len(cps) != 0 {
		t.Errorf("checkpoints left on the node after resume: %v", cps)
	}
	if out := kubectl(t, "get", "secret", pod, "-o", "jsonpath={.metadata.labels}"); strings.Contains(out, "paused") {
		t.Errorf("the resumed sandbox's Secret is still labelled paused: %s", out)
	}

	// A snapshot of the running sandbox, and a sandbox made from it on
	// the same node, restored from the checkpoint the snapshot keeps.
	res = s.sdk("snapshot", keyA, id)
	snap, clone := res["snapshot"], res["clone"]
	t.Logf("snapshot %s; counters source, then new sandbox twice: %s", snap, res["counts"])
	t.Cleanup(func() {
		cl.kubectl(nil, "delete", "pod", "hutch-"+clone, "--ignore-not-found", "--grace-period=1", "--timeout=90s") //nolint:errcheck // best effort
	})
	if cps := checkpointsOf(t, "default"); len(cps) != 1 {
		t.Errorf("checkpoints on the node with one snapshot: %v, want one", cps)
	}
	s.sdk("snap-intrude", keyB, "", "SNAPSHOT_ID="+snap)
	if code, body := s.api("POST", "/sandboxes", keyA, `{"templateID":"`+snap+`","envVars":{"X":"1"}}`); code != http.StatusBadRequest || !strings.Contains(body, "envVars") {
		t.Errorf("create from a snapshot with envVars: %d %s, want 400 naming envVars", code, body)
	}
	if code, body := s.api("DELETE", "/sandboxes/"+clone, keyA, ""); code != http.StatusNoContent {
		t.Errorf("kill of the sandbox made from the snapshot: %d %s", code, body)
	}
	s.sdk("snap-delete", keyA, "", "SNAPSHOT_ID="+snap)
	if cps := checkpointsOf(t, "default"); len(cps) != 0 {
		t.Errorf("checkpoints left after the snapshot's delete: %v", cps)
	}
	waitGone(t, "hutch-"+clone, 90*time.Second)

	// A fork of two: each carries on the parent's counter, on its own.
	code, body := s.api("POST", "/sandboxes/"+id+"/fork", keyA, `{"count":2,"timeout":300}`)
	if code != http.StatusCreated {
		t.Fatalf("fork: %d %s\n%s", code, body, s.logTail())
	}
	var forks []struct {
		Sandbox *struct {
			SandboxID string `json:"sandboxID"`
		} `json:"sandbox"`
		Error *struct {
			Message string `json:"message"`
		} `json:"error"`
	}
	if err := json.Unmarshal([]byte(body), &forks); err != nil || len(forks) != 2 {
		t.Fatalf("fork answer %s: %v", body, err)
	}
	for _, f := range forks {
		if f.Sandbox == nil {
			t.Fatalf("a fork failed: %+v", f.Error)
		}
		kid := f.Sandbox.SandboxID
		t.Cleanup(func() {
			cl.kubectl(nil, "delete", "pod", "hutch-"+kid, "--ignore-not-found", "--grace-period=1", "--timeout=90s") //nolint:errcheck // best effort
		})
		c := strings.Fields(s.sdk("count", keyA, kid)["counts"])
		a, _ := strconv.Atoi(c[0])
		b, _ := strconv.Atoi(c[1])
		t.Logf("fork %s: counter %d, then %d", kid, a, b)
		if a < before || b <= a {
			t.Errorf("fork %s: counter %d then %d, want it carrying on from past %d", kid, a, b, before)
		}
		if code, body := s.api("DELETE", "/sandboxes/"+kid, keyA, ""); code != http.StatusNoContent {
			t.Errorf("kill of fork %s: %d %s", kid, code, body)
		}
	}
	if cps := checkpointsOf(t, "default"); len(cps) != 0 {
		t.Errorf("a fork left its checkpoint: %v", cps)
	}

	// The sandbox without network pauses and is killed paused: its
	// checkpoint and record go.
	if code, body := s.api("POST", "/sandboxes/"+none+"/pause", keyA, ""); code != http.StatusNoContent {
		t.Fatalf("pause of the sandbox without network: %d %s\n%s", code, body, s.logTail())
	}
	waitGone(t, "hutch-"+none, 60*time.Second)
	cps := checkpointsOf(t, "default")
	if len(cps) != 1 {
		t.Fatalf("checkpoints after pausing the sandbox without network: %v, want one", cps)
	}
	// Its checkpoint lost (a node's disk wiped), its resume fails at once
	// with the shim's reason, and it stays paused.
	lost := filepath.Join(cl.checkpoints, "default", cps[0])
	if err := os.Rename(lost, lost+".away"); err != nil {
		t.Fatal(err)
	}
	t0 = time.Now()
	code, body = s.api("POST", "/sandboxes/"+none+"/resume", keyA, "")
	if code != http.StatusConflict || !strings.Contains(body, "no checkpoint of that name") {
		t.Errorf("resume without its checkpoint: %d %s, want 409 with the shim's reason", code, body)
	}
	if d := time.Since(t0); d > time.Minute {
		t.Errorf("resume without its checkpoint took %s to fail", d)
	}
	t.Logf("resume without its checkpoint failed in %s", time.Since(t0).Round(time.Millisecond))
	if code, body := s.api("GET", "/sandboxes/"+none, keyA, ""); code != http.StatusOK || !strings.Contains(body, `"paused"`) {
		t.Errorf("after a failed resume: %d %s, want it paused", code, body)
	}
	if err := os.Rename(lost+".away", lost); err != nil {
		t.Fatal(err)
	}
	if code, body := s.api("DELETE", "/sandboxes/"+none, keyA, ""); code != http.StatusNoContent {
		t.Errorf("kill of a paused sandbox: %d %s", code, body)
	}
	if cps := checkpointsOf(t, "default"); len(cps) != 0 {
		t.Errorf("the killed paused sandbox's checkpoint is left: %v", cps)
	}
	if out := kubectl(t, "get", "secret", "hutch-"+none, "--ignore-not-found", "-o", "name"); strings.TrimSpace(out) != "" {
		t.Errorf("the killed paused sandbox's record is left: %s", out)
	}

	// A paused sandbox holds its disk, as on a host: a tenant with room
	// for one pod's disk cannot create a second while the first is
	// paused, and the refusal leaves no pod.
	code, body = s.api("POST", "/sandboxes", keyC, `{"templateID":"base","timeout":300}`)
	if code != http.StatusCreated {
		t.Fatalf("gamma's create: %d %s\n%s", code, body, s.logTail())
	}
	var made struct {
		SandboxID string `json:"sandboxID"`
	}
	if err := json.Unmarshal([]byte(body), &made); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cl.kubectl(nil, "delete", "pod", "hutch-"+made.SandboxID, "--ignore-not-found", "--grace-period=1", "--timeout=90s") //nolint:errcheck // best effort
		cl.kubectl(nil, "delete", "secret", "hutch-"+made.SandboxID, "--ignore-not-found")                                   //nolint:errcheck // best effort
	})
	if code, body := s.api("POST", "/sandboxes/"+made.SandboxID+"/pause", keyC, ""); code != http.StatusNoContent {
		t.Fatalf("gamma's pause: %d %s\n%s", code, body, s.logTail())
	}
	waitGone(t, "hutch-"+made.SandboxID, 60*time.Second)
	if code, body := s.api("POST", "/sandboxes", keyC, `{"templateID":"base","timeout":300}`); code != http.StatusTooManyRequests || !strings.Contains(body, "max-disk") {
		t.Errorf("a create beside a paused sandbox that holds the tenant's disk: %d %s, want 429 naming max-disk", code, body)
	}
	if out := kubectl(t, "get", "pods", "-l", "hutch.dev/tenant=gamma", "-o", "name"); strings.TrimSpace(out) != "" {
		t.Errorf("the refused create left pods: %s", out)
	}
	if code, body := s.api("DELETE", "/sandboxes/"+made.SandboxID, keyC, ""); code != http.StatusNoContent {
		t.Errorf("kill of gamma's paused sandbox: %d %s", code, body)
	}

	s.sdk("kill", keyA, id)
	waitGone(t, pod, 90*time.Second)
}
