package k8s

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// `sbx serve --kubeconfig` places each sandbox as a pod on the cluster;
// the E2B SDK drives it as it drives a server on one host: create,
// commands, files, list, setTimeout, kill, and tenants that never see
// each other's sandboxes, across a restart of the server.

// kubeServe is an `sbx serve --kubeconfig` of a test.
type kubeServe struct {
	t       *testing.T
	dir     string
	tenants string
	port    int
	cmd     *exec.Cmd
	exited  chan struct{}
	log     string
}

func newKubeServe(t *testing.T) *kubeServe {
	t.Helper()
	dir := t.TempDir()
	return &kubeServe{t: t, dir: dir, tenants: filepath.Join(dir, "tenants"), log: filepath.Join(dir, "serve.log")}
}

func (s *kubeServe) sbx(args ...string) string {
	s.t.Helper()
	var stderr bytes.Buffer
	cmd := exec.Command(filepath.Join(cl.bin, "sbx"), append([]string{"--root", filepath.Join(s.dir, "root")}, args...)...)
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		s.t.Fatalf("sbx %s: %v\n%s%s", strings.Join(args, " "), err, out, stderr.String())
	}
	return string(out)
}

func (s *kubeServe) tenantAdd(name string, flags ...string) string {
	s.t.Helper()
	return strings.TrimSpace(s.sbx(append(append([]string{"tenant", "add", "--tenants", s.tenants}, flags...), name)...))
}

// start starts the server and waits until it answers.
func (s *kubeServe) start() {
	s.t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		s.t.Fatal(err)
	}
	s.port = l.Addr().(*net.TCPAddr).Port
	l.Close()
	logf, err := os.OpenFile(s.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		s.t.Fatal(err)
	}
	defer logf.Close()
	s.cmd = exec.Command(filepath.Join(cl.bin, "sbx"), "--root", filepath.Join(s.dir, "root"), "serve",
		"--listen", s.addr(), "--tenants", s.tenants, "--domain", "e2e.sbx.test", "--audit-log", "-",
		"--kubeconfig", cl.kubeconfig, "--namespace", "default",
		"--template", "base="+busyboxImage, "--image-pull-policy", "Never",
		"--pod-cpus", "0.25", "--pod-memory", "256m")
	s.cmd.Stdout, s.cmd.Stderr = logf, logf
	if err := s.cmd.Start(); err != nil {
		s.t.Fatal(err)
	}
	s.exited = make(chan struct{})
	go func() { s.cmd.Wait(); close(s.exited) }() //nolint:errcheck // read from ProcessState
	s.t.Cleanup(s.stop)
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		select {
		case <-s.exited:
			s.t.Fatalf("sbx serve exited: %v\n%s", s.cmd.ProcessState, s.logTail())
		default:
		}
		if resp, err := http.Get("http://" + s.addr() + "/health"); err == nil {
			resp.Body.Close()
			return
		}
	}
	s.t.Fatalf("sbx serve did not answer within 30s\n%s", s.logTail())
}

func (s *kubeServe) addr() string { return "127.0.0.1:" + strconv.Itoa(s.port) }

// stop stops the server with SIGTERM (once).
func (s *kubeServe) stop() {
	select {
	case <-s.exited:
		return
	default:
	}
	s.cmd.Process.Signal(syscall.SIGTERM) //nolint:errcheck // waited for below
	select {
	case <-s.exited:
		if !s.cmd.ProcessState.Success() {
			s.t.Errorf("sbx serve did not exit cleanly on SIGTERM: %v\n%s", s.cmd.ProcessState, s.logTail())
		}
	case <-time.After(30 * time.Second):
		s.cmd.Process.Kill() //nolint:errcheck // it is stuck
		<-s.exited
		s.t.Errorf("sbx serve did not stop within 30s of SIGTERM")
	}
}

func (s *kubeServe) logTail() string {
	b, _ := os.ReadFile(s.log)
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > 30 {
		lines = lines[len(lines)-30:]
	}
	return strings.Join(lines, "\n")
}

// sdkScript is the E2B SDK steps the test runs, one per node process:
// STEP picks one, SANDBOX_ID names the sandbox made by "create". Each
// prints one line RESULT {json} when all its assertions held.
const sdkScript = `
import { Sandbox, CommandExitError } from 'E2B_SDK'
import assert from 'node:assert/strict'

const id = process.env.SANDBOX_ID
const out = {}
const listAll = async () => {
  const p = Sandbox.list()
  const all = []
  for (let i = 0; p.hasNext && i < 20; i++) all.push(...(await p.nextItems()))
  return all
}

switch (process.env.STEP) {
case 'create': {
  const sbx = await Sandbox.create('base', { timeoutMs: 600_000, envs: { SBX_K8S_VAR: 'from-create' }, metadata: { suite: 'k8s' }, requestTimeoutMs: 180_000 })
  const short = await Sandbox.create('base', { timeoutMs: 4_000, metadata: { suite: 'k8s-short' }, requestTimeoutMs: 180_000 })
  out.id = sbx.sandboxId
  out.short = short.sandboxId
  const ids = (await listAll()).map((s) => s.sandboxId)
  assert.ok(ids.includes(sbx.sandboxId), 'list does not show the new sandbox: ' + ids)
  const info = await sbx.getInfo()
  assert.equal(info.metadata.suite, 'k8s')
  break
}
case 'use': {
  const sbx = await Sandbox.connect(id)
  const r = await sbx.commands.run('echo "hello $SBX_K8S_VAR"; echo to-stderr >&2')
  assert.equal(r.exitCode, 0)
  assert.equal(r.stdout, 'hello from-create\n')
  assert.equal(r.stderr, 'to-stderr\n')
  const envs = await sbx.commands.run('echo "$A|$PWD"', { envs: { A: 'per command' }, cwd: '/tmp' })
  assert.equal(envs.stdout, 'per command|/tmp\n')
  let failed
  try { await sbx.commands.run('echo partial; exit 7') } catch (e) { failed = e }
  assert.ok(failed instanceof CommandExitError, 'exit 7 did not throw CommandExitError: ' + failed)
  assert.equal(failed.exitCode, 7)
  assert.equal(failed.stdout, 'partial\n')
  out.kernel = (await sbx.commands.run('dmesg')).stdout
  let missing
  try { await sbx.commands.run('no-such-command-xyz') } catch (e) { missing = e }
  assert.equal(missing?.exitCode, 127, 'an unknown command: ' + missing)
  const bg = await sbx.commands.run('sleep 300', { background: true })
  assert.ok(bg.pid > 0, 'a background command has no PID')
  assert.equal(await bg.kill(), true, 'kill of a running command answered false')
  let killed
  try { await bg.wait() } catch (e) { killed = e }
  assert.ok(killed instanceof CommandExitError && /killed/.test(killed.message), 'a command killed with SIGKILL: ' + killed)
  await sbx.files.write('/tmp/dir/hello.txt', 'written through the SDK\n')
  assert.equal(await sbx.files.read('/tmp/dir/hello.txt'), 'written through the SDK\n')
  assert.equal((await sbx.commands.run('cat /tmp/dir/hello.txt')).stdout, 'written through the SDK\n')
  await sbx.setTimeout(900_000)
  const end = (await sbx.getInfo()).endAt.getTime()
  assert.ok(Math.abs(end - (Date.now() + 900_000)) < 30_000, 'endAt ' + new Date(end).toISOString() + ' is not 15 minutes from now')
  break
}
case 'intrude': {
  const ids = (await listAll()).map((s) => s.sandboxId)
  assert.ok(!ids.includes(id), 'another tenant lists the sandbox')
  assert.equal(await Sandbox.kill(id), false, 'another tenant killed the sandbox')
  let err
  try { await Sandbox.connect(id) } catch (e) { err = e }
  assert.ok(err, 'another tenant connected to the sandbox')
  out.connectError = String(err)
  break
}
case 'again': {
  const ids = (await listAll()).map((s) => s.sandboxId)
  assert.ok(ids.includes(id), 'after a restart the server does not list the sandbox: ' + ids)
  const sbx = await Sandbox.connect(id)
  assert.equal((await sbx.commands.run('cat /tmp/dir/hello.txt')).stdout, 'written through the SDK\n')
  break
}
case 'kill': {
  assert.equal(await Sandbox.kill(id), true, 'kill answered false')
  const ids = (await listAll()).map((s) => s.sandboxId)
  assert.ok(!ids.includes(id), 'the killed sandbox is still listed')
  break
}
}
console.log('RESULT ' + JSON.stringify(out))
`

// sdk runs one step of sdkScript with key and returns its result.
func (s *kubeServe) sdk(step, key, id string) map[string]string {
	s.t.Helper()
	node, err := exec.LookPath("node")
	if err != nil {
		s.t.Fatal("node is not installed (scripts/install-deps.sh installs it)")
	}
	sdk := filepath.Join(cl.repo, "integration", "e2b", "node_modules", "e2b", "dist", "index.mjs")
	if _, err := os.Stat(sdk); err != nil {
		s.t.Fatalf("the E2B SDK is not installed (make e2b-sdk): %v", err)
	}
	script := filepath.Join(s.dir, "sdk.mjs")
	if err := os.WriteFile(script, []byte(strings.Replace(sdkScript, "E2B_SDK", "file://"+sdk, 1)), 0o644); err != nil {
		s.t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, script)
	cmd.Env = append(os.Environ(), "STEP="+step, "SANDBOX_ID="+id, "E2B_API_KEY="+key,
		"E2B_API_URL=http://"+s.addr(), "E2B_SANDBOX_URL=http://"+s.addr(), "E2B_DOMAIN=e2e.sbx.test")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stdout, err := cmd.Output()
	var res map[string]string
	sc := bufio.NewScanner(bytes.NewReader(stdout))
	for sc.Scan() {
		if r, ok := strings.CutPrefix(sc.Text(), "RESULT "); ok {
			json.Unmarshal([]byte(r), &res) //nolint:errcheck // checked below
		}
	}
	if err != nil || res == nil {
		s.t.Fatalf("SDK step %s: %v\n%s%s\nserver log:\n%s", step, err, stdout, stderr.String(), s.logTail())
	}
	return res
}

// api calls the server's REST API with key.
func (s *kubeServe) api(method, path, key, body string) (int, string) {
	s.t.Helper()
	req, _ := http.NewRequest(method, "http://"+s.addr()+path, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-API-Key", key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		s.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// sandboxPod is what the test reads of a sandbox's pod.
type sandboxPod struct {
	Metadata struct {
		Labels map[string]string `json:"labels"`
	} `json:"metadata"`
	Spec struct {
		RuntimeClassName string `json:"runtimeClassName"`
	} `json:"spec"`
	Status struct {
		Phase string `json:"phase"`
	} `json:"status"`
}

// waitGone waits until pod name no longer exists.
func waitGone(t *testing.T, name string, d time.Duration) {
	t.Helper()
	for deadline := time.Now().Add(d); ; time.Sleep(time.Second) {
		out, err := cl.kubectl(nil, "get", "pod", name, "--ignore-not-found", "-o", "name")
		if err == nil && strings.TrimSpace(out) == "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("pod %s still exists %s on: %q, %v", name, d, out, err)
		}
	}
}

func TestServeOnKubernetes(t *testing.T) {
	s := newKubeServe(t)
	keyA := s.tenantAdd("alpha")
	keyB := s.tenantAdd("beta")
	keyC := s.tenantAdd("gamma", "--max-cpus", "0.1")
	s.start()

	// Bad creates leave no pod: a template the server does not map, a
	// tenant's quota (a pod takes 0.25 CPUs).
	if code, body := s.api("POST", "/sandboxes", keyA, `{"templateID":"nope"}`); code != http.StatusNotFound || !strings.Contains(body, "base") {
		t.Errorf("create from an unmapped template: %d %s, want 404 naming base", code, body)
	}
	if code, body := s.api("POST", "/sandboxes", keyC, `{"templateID":"base"}`); code != http.StatusTooManyRequests {
		t.Errorf("create over the tenant's CPU quota: %d %s, want 429", code, body)
	}
	if out := kubectl(t, "get", "pods", "-l", "app.kubernetes.io/managed-by=sbx-serve", "-o", "name"); strings.TrimSpace(out) != "" {
		t.Errorf("refused creates left pods: %s", out)
	}

	res := s.sdk("create", keyA, "")
	id, short := res["id"], res["short"]
	pod := "sbx-" + id
	t.Cleanup(func() {
		cl.kubectl(nil, "delete", "pod", pod, "sbx-"+short, "--ignore-not-found", "--grace-period=1", "--timeout=90s") //nolint:errcheck // best effort
	})
	var p sandboxPod
	if err := json.Unmarshal([]byte(kubectl(t, "get", "pod", pod, "-o", "json")), &p); err != nil {
		t.Fatal(err)
	}
	if p.Spec.RuntimeClassName != "sbx" || p.Status.Phase != "Running" || p.Metadata.Labels["sbx.dev/tenant"] != "alpha" {
		t.Fatalf("sandbox pod: runtimeClassName %q, phase %q, labels %v; want sbx, Running, tenant alpha", p.Spec.RuntimeClassName, p.Status.Phase, p.Metadata.Labels)
	}

	// The short-lived sandbox's pod goes when its 4 s are up.
	waitGone(t, "sbx-"+short, 60*time.Second)

	// E2B's SDK runs commands with /bin/bash, which busybox lacks: a
	// shell that passes them to busybox sh stands in.
	kubectl(t, "exec", pod, "--", "sh", "-c", `printf '#!/bin/sh\nexec /bin/sh "$@"\n' >/bin/bash && chmod +x /bin/bash`)

	res = s.sdk("use", keyA, id)
	t.Logf("dmesg in the sandbox: %.80q", res["kernel"])
	if !strings.Contains(res["kernel"], "gVisor") {
		t.Errorf("dmesg in the sandbox %q: want gVisor's", res["kernel"])
	}

	// Another tenant neither sees nor reaches it.
	s.sdk("intrude", keyB, id)
	if code, body := s.api("GET", "/sandboxes/"+id, keyB, ""); code != http.StatusNotFound {
		t.Errorf("another tenant's GET /sandboxes/%s: %d %s, want 404", id, code, body)
	}
	kubectl(t, "get", "pod", pod)

	// What pods cannot do is refused by name.
	for _, path := range []string{"/sandboxes/" + id + "/pause", "/sandboxes/" + id + "/snapshots"} {
		code, body := s.api("POST", path, keyA, "")
		if code != http.StatusNotImplemented || !strings.Contains(body, "Kubernetes") {
			t.Errorf("POST %s: %d %s, want 501 naming Kubernetes", path, code, body)
		}
	}

	// A new server finds the sandbox in the cluster, with the same
	// access token.
	s.stop()
	s.start()
	s.sdk("again", keyA, id)

	s.sdk("kill", keyA, id)
	waitGone(t, pod, 90*time.Second)
}
