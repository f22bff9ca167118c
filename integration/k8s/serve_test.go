package k8s

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
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

	"hutch.dev/hutch/agent/agentnet"
)

// `hutch serve --kubeconfig` places each sandbox as a pod on the cluster;
// the E2B SDK drives it as it drives a server on one host: create,
// commands, files, list, setTimeout, kill, and tenants that never see
// each other's sandboxes, across a restart of the server.

// kubeServe is a `hutch serve` of a test, on the Kubernetes backend
// (kubeBackend) or the local one.
type kubeServe struct {
	t       *testing.T
	dir     string
	tenants string
	key     string // of the tenant startServedHutch adds
	port    int
	cmd     *exec.Cmd
	exited  chan struct{}
	log     string
}

// kubeBackend is the flags of `hutch serve --backend kubernetes` on the test
// cluster, then more.
func kubeBackend(more ...string) []string {
	return append([]string{"--backend", "kubernetes", "--kubeconfig", cl.kubeconfig, "--namespace", "default",
		"--image-pull-policy", "Never"}, more...)
}

func newKubeServe(t *testing.T) *kubeServe {
	t.Helper()
	dir := t.TempDir()
	return &kubeServe{t: t, dir: dir, tenants: filepath.Join(dir, "tenants"), log: filepath.Join(dir, "serve.log")}
}

func (s *kubeServe) hutch(args ...string) string {
	s.t.Helper()
	var stderr bytes.Buffer
	cmd := exec.Command(filepath.Join(cl.bin, "hutch"), append([]string{"--root", filepath.Join(s.dir, "root")}, args...)...)
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		s.t.Fatalf("hutch %s: %v\n%s%s", strings.Join(args, " "), err, out, stderr.String())
	}
	return string(out)
}

func (s *kubeServe) tenantAdd(name string, flags ...string) string {
	s.t.Helper()
	return strings.TrimSpace(s.hutch(append(append([]string{"tenant", "add", "--tenants", s.tenants}, flags...), name)...))
}

// start starts the server with args after the common flags and waits
// until it answers.
func (s *kubeServe) start(args ...string) {
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
	s.cmd = exec.Command(filepath.Join(cl.bin, "hutch"), append([]string{"--root", filepath.Join(s.dir, "root"), "serve",
		"--listen", s.addr(), "--tenants", s.tenants, "--domain", "e2e.hutch.test", "--audit-log", "-"}, args...)...)
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
			s.t.Fatalf("hutch serve exited: %v\n%s", s.cmd.ProcessState, s.logTail())
		default:
		}
		if resp, err := http.Get("http://" + s.addr() + "/health"); err == nil {
			resp.Body.Close()
			return
		}
	}
	s.t.Fatalf("hutch serve did not answer within 30s\n%s", s.logTail())
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
			s.t.Errorf("hutch serve did not exit cleanly on SIGTERM: %v\n%s", s.cmd.ProcessState, s.logTail())
		}
	case <-time.After(30 * time.Second):
		s.cmd.Process.Kill() //nolint:errcheck // it is stuck
		<-s.exited
		s.t.Errorf("hutch serve did not stop within 30s of SIGTERM")
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
import http from 'node:http'

const id = process.env.SANDBOX_ID
// byHost is one request to the server with Host host, as a browser
// sends for sandbox.getHost(port).
const byHost = (host, path) => new Promise((resolve, reject) => {
  const u = new URL(process.env.E2B_API_URL)
  const req = http.request({ host: u.hostname, port: u.port, path, headers: { Host: host }, timeout: 5_000 }, (res) => {
    const chunks = []
    res.on('data', (c) => chunks.push(c))
    res.on('end', () => resolve({ status: res.statusCode, body: Buffer.concat(chunks).toString() }))
  })
  req.on('timeout', () => req.destroy(new Error('timed out')))
  req.on('error', reject)
  req.end()
})
const out = {}
const listAll = async () => {
  const p = Sandbox.list()
  const all = []
  for (let i = 0; p.hasNext && i < 20; i++) all.push(...(await p.nextItems()))
  return all
}

switch (process.env.STEP) {
case 'create': {
  const hutch = await Sandbox.create('base', { timeoutMs: 600_000, allowInternetAccess: true, envs: { HUTCH_K8S_VAR: 'from-create' }, metadata: { suite: 'k8s' }, requestTimeoutMs: 180_000 })
  const none = await Sandbox.create('base', { timeoutMs: 600_000, requestTimeoutMs: 180_000 }) // the server's default network: none
  out.none = none.sandboxId
  const short = await Sandbox.create('base', { timeoutMs: 4_000, metadata: { suite: 'k8s-short' }, requestTimeoutMs: 180_000 })
  out.id = hutch.sandboxId
  out.short = short.sandboxId
  const ids = (await listAll()).map((s) => s.sandboxId)
  assert.ok(ids.includes(hutch.sandboxId), 'list does not show the new sandbox: ' + ids)
  const info = await hutch.getInfo()
  assert.equal(info.metadata.suite, 'k8s')
  break
}
case 'use': {
  const hutch = await Sandbox.connect(id)
  const r = await hutch.commands.run('echo "hello $HUTCH_K8S_VAR"; echo to-stderr >&2')
  assert.equal(r.exitCode, 0)
  assert.equal(r.stdout, 'hello from-create\n')
  assert.equal(r.stderr, 'to-stderr\n')
  const envs = await hutch.commands.run('echo "$A|$PWD"', { envs: { A: 'per command' }, cwd: '/tmp' })
  assert.equal(envs.stdout, 'per command|/tmp\n')
  let failed
  try { await hutch.commands.run('echo partial; exit 7') } catch (e) { failed = e }
  assert.ok(failed instanceof CommandExitError, 'exit 7 did not throw CommandExitError: ' + failed)
  assert.equal(failed.exitCode, 7)
  assert.equal(failed.stdout, 'partial\n')
  out.kernel = (await hutch.commands.run('dmesg')).stdout
  let missing
  try { await hutch.commands.run('no-such-command-xyz') } catch (e) { missing = e }
  assert.equal(missing?.exitCode, 127, 'an unknown command: ' + missing)
  const bg = await hutch.commands.run('sleep 300', { background: true })
  assert.ok(bg.pid > 0, 'a background command has no PID')
  assert.equal(await bg.kill(), true, 'kill of a running command answered false')
  let killed
  try { await bg.wait() } catch (e) { killed = e }
  assert.ok(killed instanceof CommandExitError && /killed/.test(killed.message), 'a command killed with SIGKILL: ' + killed)
  await hutch.files.write('/tmp/dir/hello.txt', 'written through the SDK\n')
  assert.equal(await hutch.files.read('/tmp/dir/hello.txt'), 'written through the SDK\n')
  assert.equal((await hutch.commands.run('cat /tmp/dir/hello.txt')).stdout, 'written through the SDK\n')
  // A terminal: its size, a resize, input, its exit status.
  let term = ''
  const dec = new TextDecoder()
  const pty = await hutch.pty.create({ cols: 80, rows: 24, onData: (d) => { term += dec.decode(d, { stream: true }) }, timeoutMs: 60_000 })
  const send = (s) => hutch.pty.sendInput(pty.pid, new TextEncoder().encode(s))
  const expect = async (what, re) => {
    for (const end = Date.now() + 20_000; !re.test(term); await new Promise((r) => setTimeout(r, 100))) {
      if (Date.now() > end) throw new Error('terminal: no ' + what + ' in ' + JSON.stringify(term))
    }
    term = term.slice(re.exec(term).index + 1)
  }
  await send('stty size | sed "s/^/size=/"\n')
  await expect('stty size 24 80', /size=24 80/)
  await hutch.pty.resize(pty.pid, { cols: 100, rows: 30 })
  await send('stty size | sed "s/^/size=/"\n')
  await expect('stty size 30 100', /size=30 100/)
  await send('exit 4\n')
  const ended = await pty.wait().catch((e) => e)
  assert.equal(ended.exitCode, 4, 'terminal exit status: ' + JSON.stringify(ended))
  // A port preview of a server on the sandbox's loopback only.
  await hutch.commands.run('mkdir -p /tmp/www && echo hello-preview >/tmp/www/index.html')
  const srv = await hutch.commands.run('httpd -f -p 127.0.0.1:8000 -h /tmp/www', { background: true, timeoutMs: 0 })
  let page
  for (const end = Date.now() + 20_000; Date.now() < end; await new Promise((r) => setTimeout(r, 250))) {
    page = await byHost(hutch.getHost(8000), '/index.html')
    if (page.status === 200) break
  }
  assert.equal(page.status, 200, 'getHost(8000): ' + JSON.stringify(page))
  assert.equal(page.body, 'hello-preview\n')
  const closed = await byHost(hutch.getHost(8001), '/')
  assert.ok(closed.status >= 500, 'a port nothing listens on answered ' + closed.status)
  await srv.kill()
  const big = 'hutch-'.repeat(256 << 10)
  await hutch.files.write('/tmp/big.txt', big)
  assert.equal(await hutch.files.read('/tmp/big.txt'), big, 'a 1 MiB file did not come back as written')
  // Every environment a process of the sandbox can read: the agent's
  // key is in none.
  out.environ = (await hutch.commands.run('for p in /proc/[0-9]*; do echo "$p: $(tr "\\0" " " <$p/environ 2>&1)"; done; env')).stdout
  await hutch.setTimeout(900_000)
  const end = (await hutch.getInfo()).endAt.getTime()
  assert.ok(Math.abs(end - (Date.now() + 900_000)) < 30_000, 'endAt ' + new Date(end).toISOString() + ' is not 15 minutes from now')
  break
}
case 'none': {
  const hutch = await Sandbox.connect(id)
  out.netdev = (await hutch.commands.run('cat /proc/net/dev')).stdout
  await hutch.files.write('/tmp/none.txt', 'no network\n')
  assert.equal((await hutch.commands.run('cat /tmp/none.txt')).stdout, 'no network\n')
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
  const hutch = await Sandbox.connect(id)
  assert.equal((await hutch.commands.run('cat /tmp/dir/hello.txt')).stdout, 'written through the SDK\n')
  break
}
case 'pause': {
  // A process counting in memory, files in /tmp and the root
  // filesystem, then a pause.
  const hutch = await Sandbox.connect(id)
  const bg = await hutch.commands.run('i=0; while :; do i=$((i+1)); echo $i >/tmp/count; sleep 0.1; done', { background: true, timeoutMs: 0 })
  out.pid = String(bg.pid)
  await hutch.files.write('/var/before-pause.txt', 'kept across pause\n')
  let n = 0
  for (const end = Date.now() + 20_000; n < 20 && Date.now() < end; await new Promise((r) => setTimeout(r, 200))) {
    n = Number((await hutch.commands.run('cat /tmp/count')).stdout)
  }
  assert.ok(n >= 20, 'the counter did not count: ' + n)
  assert.equal(await hutch.pause(), true)
  out.before = String(n)
  const info = await Sandbox.getInfo(id)
  assert.equal(info.state, 'paused')
  const paused = (await listAll()).filter((s) => s.sandboxId === id)
  assert.equal(paused.length, 1, 'list shows the paused sandbox ' + paused.length + ' times')
  assert.equal(paused[0].state, 'paused')
  assert.equal(await Sandbox.pause(id), false, 'pausing a paused sandbox must answer false')
  break
}
case 'resume': {
  const hutch = await Sandbox.connect(id, { timeoutMs: 600_000 })
  const info = await hutch.getInfo()
  assert.equal(info.state, 'running')
  const count = async () => Number((await hutch.commands.run('cat /tmp/count')).stdout)
  const a = await count()
  await new Promise((r) => setTimeout(r, 1_500))
  const b = await count()
  out.after = String(a)
  out.later = String(b)
  assert.ok(b > a, 'the counter started before the pause does not count after resume: ' + a + ', then ' + b)
  assert.equal((await hutch.commands.run('cat /var/before-pause.txt')).stdout, 'kept across pause\n')
  out.ps = (await hutch.commands.run('ps -o pid,args')).stdout
  break
}
case 'snapshot': {
  // A snapshot of a running sandbox, which runs on; a sandbox made from
  // it carries on its processes and files, and is a sandbox of its own.
  const hutch = await Sandbox.connect(id)
  const count = async (s) => Number((await s.commands.run('cat /tmp/count')).stdout)
  await hutch.files.write('/var/in-snapshot.txt', 'snapshotted\n')
  const snap = await hutch.createSnapshot({ requestTimeoutMs: 120_000 })
  assert.ok(snap.snapshotId, 'no snapshotId')
  out.snapshot = snap.snapshotId
  const p = hutch.listSnapshots()
  const listed = []
  for (let i = 0; p.hasNext && i < 20; i++) listed.push(...(await p.nextItems()))
  assert.ok(listed.some((s) => s.snapshotId === snap.snapshotId), 'listSnapshots lacks ' + snap.snapshotId + ': ' + JSON.stringify(listed))
  assert.equal((await hutch.getInfo()).state, 'running', 'the source must run on after the snapshot')
  const a = await count(hutch)
  const from = await Sandbox.create(snap.snapshotId, { timeoutMs: 300_000, requestTimeoutMs: 180_000 })
  out.clone = from.sandboxId
  assert.notEqual(from.sandboxId, id)
  assert.equal(await from.files.read('/var/in-snapshot.txt'), 'snapshotted\n')
  const c1 = await count(from)
  await new Promise((r) => setTimeout(r, 1_500))
  const c2 = await count(from)
  assert.ok(c1 >= a - 50 && c2 > c1, 'the snapshot\'s counter does not carry on in the new sandbox: ' + c1 + ', then ' + c2)
  assert.ok(await count(hutch) > a, 'the source stopped counting')
  await from.files.write('/var/only-in-clone.txt', 'clone\n')
  const there = await hutch.commands.run('test -e /var/only-in-clone.txt').catch((e) => e)
  assert.equal(there.exitCode, 1, 'a file written in the new sandbox shows in the source')
  out.counts = a + ' ' + c1 + ' ' + c2
  break
}
case 'count': {
  // The counter of the pause step, read twice.
  const hutch = await Sandbox.connect(id)
  const count = async () => Number((await hutch.commands.run('cat /tmp/count')).stdout)
  const a = await count()
  await new Promise((r) => setTimeout(r, 1_500))
  out.counts = a + ' ' + (await count())
  break
}
case 'snap-intrude': {
  // Another tenant neither makes a sandbox from the snapshot nor deletes it.
  const err = await Sandbox.create(process.env.SNAPSHOT_ID, { requestTimeoutMs: 60_000 }).catch((e) => e)
  assert.ok(err instanceof Error, 'another tenant made a sandbox from the snapshot')
  out.createError = String(err)
  assert.equal(await Sandbox.deleteSnapshot(process.env.SNAPSHOT_ID), false, 'another tenant deleted the snapshot')
  break
}
case 'snap-delete': {
  assert.equal(await Sandbox.deleteSnapshot(process.env.SNAPSHOT_ID), true)
  assert.equal(await Sandbox.deleteSnapshot(process.env.SNAPSHOT_ID), false)
  const err = await Sandbox.create(process.env.SNAPSHOT_ID, { requestTimeoutMs: 60_000 }).catch((e) => e)
  assert.ok(err instanceof Error, 'a sandbox was made from a deleted snapshot')
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
func (s *kubeServe) sdk(step, key, id string, env ...string) map[string]string {
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
		"E2B_API_URL=http://"+s.addr(), "E2B_SANDBOX_URL=http://"+s.addr(), "E2B_DOMAIN=e2e.hutch.test")
	cmd.Env = append(cmd.Env, env...)
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

// connectToken is the envdAccessToken connect gives for sandbox id.
func (s *kubeServe) connectToken(key, id string) string {
	s.t.Helper()
	code, body := s.api("POST", "/sandboxes/"+id+"/connect", key, `{"timeout":600}`)
	var c struct {
		EnvdAccessToken string `json:"envdAccessToken"`
	}
	if err := json.Unmarshal([]byte(body), &c); (code != http.StatusOK && code != http.StatusCreated) || err != nil || c.EnvdAccessToken == "" {
		s.t.Fatalf("connect %s: %d %s", id, code, body)
	}
	return c.EnvdAccessToken
}

// envd reads a file of sandbox id through the data plane with token,
// and answers the status.
func (s *kubeServe) envd(id, token string) int {
	s.t.Helper()
	req, _ := http.NewRequest("GET", "http://"+s.addr()+"/files?path=/etc/hostname&username=root", nil)
	req.Header.Set("E2b-Sandbox-Id", id)
	req.Header.Set("E2b-Sandbox-Port", "49983")
	req.Header.Set("X-Access-Token", token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		s.t.Fatal(err)
	}
	defer resp.Body.Close()
	io.Copy(io.Discard, resp.Body) //nolint:errcheck // only the status matters
	return resp.StatusCode
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
		PodIP string `json:"podIP"`
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
	s.start(kubeBackend("--template", "base="+busyboxImage, "--pod-cpus", "0.25", "--pod-memory", "256m")...)

	// Bad creates leave no pod: a template the server does not map, a
	// tenant's quota (a pod takes 0.25 CPUs).
	if code, body := s.api("POST", "/sandboxes", keyA, `{"templateID":"nope"}`); code != http.StatusNotFound || !strings.Contains(body, "base") {
		t.Errorf("create from an unmapped template: %d %s, want 404 naming base", code, body)
	}
	if code, body := s.api("POST", "/sandboxes", keyC, `{"templateID":"base"}`); code != http.StatusTooManyRequests {
		t.Errorf("create over the tenant's CPU quota: %d %s, want 429", code, body)
	}
	if out := kubectl(t, "get", "pods", "-l", "app.kubernetes.io/managed-by=hutch-serve", "-o", "name"); strings.TrimSpace(out) != "" {
		t.Errorf("refused creates left pods: %s", out)
	}

	res := s.sdk("create", keyA, "")
	id, short, none := res["id"], res["short"], res["none"]
	pod := "hutch-" + id
	t.Cleanup(func() {
		cl.kubectl(nil, "delete", "pod", pod, "hutch-"+short, "hutch-"+none, "--ignore-not-found", "--grace-period=1", "--timeout=90s") //nolint:errcheck // best effort
	})
	var p sandboxPod
	if err := json.Unmarshal([]byte(kubectl(t, "get", "pod", pod, "-o", "json")), &p); err != nil {
		t.Fatal(err)
	}
	if p.Spec.RuntimeClassName != "hutch" || p.Status.Phase != "Running" || p.Metadata.Labels["hutch.dev/tenant"] != "alpha" {
		t.Fatalf("sandbox pod: runtimeClassName %q, phase %q, labels %v; want hutch, Running, tenant alpha", p.Spec.RuntimeClassName, p.Status.Phase, p.Metadata.Labels)
	}

	// The short-lived sandbox's pod goes when its 4 s are up.
	waitGone(t, "hutch-"+short, 60*time.Second)

	// E2B's SDK runs commands with /bin/bash, which busybox lacks: a
	// shell that passes them to busybox sh stands in.
	for _, p := range []string{pod, "hutch-" + none} {
		kubectl(t, "exec", p, "--", "sh", "-c", `printf '#!/bin/sh\nexec /bin/sh "$@"\n' >/bin/bash && chmod +x /bin/bash`)
	}

	// Commands and files of a sandbox with network go to its agent's
	// endpoint on the pod network: none through the API server.
	execs := apiExecCount(t)
	res = s.sdk("use", keyA, id)
	t.Logf("dmesg in the sandbox: %.80q", res["kernel"])
	if !strings.Contains(res["kernel"], "gVisor") {
		t.Errorf("dmesg in the sandbox %q: want gVisor's", res["kernel"])
	}
	if n := apiExecCount(t) - execs; n != 0 {
		t.Errorf("commands and files of a sandbox with network made %d pods/exec calls, want none", n)
	}
	key := agentKey(t, id)
	if strings.Contains(res["environ"], key) || strings.Contains(res["environ"], "HUTCH_AGENT_KEY") || !strings.Contains(res["environ"], "HUTCH_K8S_VAR") {
		t.Errorf("the sandbox's processes see the agent's key (or no environment at all):\n%s", res["environ"])
	}
	agentRefusesStrangers(t, pod, key)
	agentListenerComesBack(t, pod, key)

	// A sandbox without network has no endpoint: pods/exec reaches it,
	// and it stays without network.
	execs = apiExecCount(t)
	res = s.sdk("none", keyA, none)
	if apiExecCount(t) == execs {
		t.Error("commands of a sandbox without network made no pods/exec call")
	}
	for _, l := range strings.Split(res["netdev"], "\n")[2:] {
		if name, _, _ := strings.Cut(strings.TrimSpace(l), ":"); name != "" && name != "lo" {
			t.Errorf("a sandbox with network none has interface %q:\n%s", name, res["netdev"])
		}
	}
	if out := kubectl(t, "get", "secret", "hutch-"+none, "--ignore-not-found", "-o", "name"); strings.TrimSpace(out) != "" {
		t.Errorf("a sandbox without network has an agent key: %s", out)
	}

	// Another tenant neither sees nor reaches it.
	s.sdk("intrude", keyB, id)
	if code, body := s.api("GET", "/sandboxes/"+id, keyB, ""); code != http.StatusNotFound {
		t.Errorf("another tenant's GET /sandboxes/%s: %d %s, want 404", id, code, body)
	}
	kubectl(t, "get", "pod", pod)

	// Its tenant replaces its tokens: the pod's annotation keeps the
	// generation, the old token opens nothing, another tenant cannot.
	oldToken := s.connectToken(keyA, id)
	if code := s.envd(id, oldToken); code != http.StatusOK {
		t.Errorf("a file with the sandbox's token: %d, want 200", code)
	}
	if code, body := s.api("POST", "/sandboxes/"+id+"/tokens", keyB, ""); code != http.StatusNotFound {
		t.Errorf("another tenant's POST /sandboxes/%s/tokens: %d %s, want 404", id, code, body)
	}
	code, body := s.api("POST", "/sandboxes/"+id+"/tokens", keyA, "")
	var rotated struct {
		EnvdAccessToken string `json:"envdAccessToken"`
	}
	if err := json.Unmarshal([]byte(body), &rotated); code != http.StatusOK || err != nil || rotated.EnvdAccessToken == "" || rotated.EnvdAccessToken == oldToken {
		t.Fatalf("POST /sandboxes/%s/tokens: %d %s, want 200 with a new envdAccessToken", id, code, body)
	}
	newToken := rotated.EnvdAccessToken
	if g := kubectl(t, "get", "pod", pod, "-o", `jsonpath={.metadata.annotations.hutch\.dev/token-generation}`); strings.TrimSpace(g) != "1" {
		t.Errorf("the pod's token generation annotation: %q, want 1", g)
	}
	if a, b := s.envd(id, oldToken), s.envd(id, newToken); a != http.StatusBadGateway || b != http.StatusOK {
		t.Errorf("after the replace: the old token %d, the new one %d; want 502 and 200", a, b)
	}
	if got := s.connectToken(keyA, id); got != newToken {
		t.Errorf("connect after the replace gives token %s, want the new one %s", got, newToken)
	}

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
	s.start(kubeBackend("--template", "base="+busyboxImage, "--pod-cpus", "0.25", "--pod-memory", "256m")...)
	s.sdk("again", keyA, id)
	if a, b := s.envd(id, oldToken), s.envd(id, newToken); a != http.StatusBadGateway || b != http.StatusOK {
		t.Errorf("after a restart: the replaced token %d, the new one %d; want 502 and 200", a, b)
	}

	s.sdk("kill", keyA, id)
	waitGone(t, pod, 90*time.Second)
	if out := kubectl(t, "get", "secret", pod, "--ignore-not-found", "-o", "name"); strings.TrimSpace(out) != "" {
		t.Errorf("the killed sandbox's agent key is left: %s", out)
	}
}

// apiExecCount is how many pods/exec calls the API server has served.
func apiExecCount(t *testing.T) int {
	t.Helper()
	n := 0
	for _, l := range strings.Split(kubectl(t, "get", "--raw", "/metrics"), "\n") {
		if !strings.HasPrefix(l, "apiserver_request_total{") || !strings.Contains(l, `subresource="exec"`) {
			continue
		}
		f := strings.Fields(l)
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		if err != nil {
			t.Fatalf("metric line %q: %v", l, err)
		}
		n += int(v)
	}
	return n
}

// agentKey is the key of sandbox id's agent, from its Secret (hex).
func agentKey(t *testing.T, id string) string {
	t.Helper()
	b64 := kubectl(t, "get", "secret", "hutch-"+id, "-o", "jsonpath={.data.agent-key}")
	b, err := base64.StdEncoding.DecodeString(strings.TrimSpace(b64))
	if err != nil || len(b) != 64 {
		t.Fatalf("secret hutch-%s: agent-key %q: %v", id, b64, err)
	}
	return string(b)
}

// agentExec runs args through the agent's endpoint at addr with key.
func agentExec(addr string, key []byte, args ...string) (int, string, error) {
	nc, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return -1, "", err
	}
	c, err := agentnet.Client(nc, key)
	if err != nil {
		nc.Close()
		return -1, "", err
	}
	var out bytes.Buffer
	code, err := agentnet.Exec(context.Background(), c, args, nil, &out, &out)
	return code, out.String(), err
}

// agentListenerComesBack: a process of the sandbox that kills the
// agent's listener takes the sandbox's endpoint away only for a moment:
// the init, which keeps the key, starts it again.
func agentListenerComesBack(t *testing.T, pod, hexKey string) {
	t.Helper()
	key, _ := hex.DecodeString(hexKey)
	ip := strings.TrimSpace(kubectl(t, "get", "pod", pod, "-o", "jsonpath={.status.podIP}"))
	addr := net.JoinHostPort(ip, strconv.Itoa(agentnet.Port))
	listener := func() (string, error) {
		code, out, err := agentExec(addr, key, "sh", "-c", "ps -o pid,args | grep '[l]isten-serve' | awk '{print $1}'")
		if err != nil || code != 0 || strings.TrimSpace(out) == "" {
			return "", fmt.Errorf("exit %d, %q, %v", code, out, err)
		}
		return strings.TrimSpace(out), nil
	}
	before, err := listener()
	if err != nil {
		t.Fatalf("the agent's listener: %v", err)
	}
	if code, out, err := agentExec(addr, key, "sh", "-c", "(sleep 1; kill -9 "+before+") >/dev/null 2>&1 &"); err != nil || code != 0 {
		t.Fatalf("kill the listener from inside: exit %d %q %v", code, out, err)
	}
	time.Sleep(1500 * time.Millisecond)
	var after string
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(500 * time.Millisecond) {
		if after, err = listener(); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the agent's endpoint did not come back within 20 s of its listener being killed: %v", err)
		}
	}
	if after == before {
		t.Fatalf("the listener %s was not killed", before)
	}
}

// agentRefusesStrangers: another pod on the pod network reaches the
// agent's port of sandbox pod, but without its key runs nothing there,
// neither with a request sent in the clear nor with a guessed key; with
// the key the endpoint works.
func agentRefusesStrangers(t *testing.T, pod, hexKey string) {
	t.Helper()
	var p sandboxPod
	if err := json.Unmarshal([]byte(kubectl(t, "get", "pod", pod, "-o", "json")), &p); err != nil {
		t.Fatal(err)
	}
	addr := net.JoinHostPort(p.Status.PodIP, strconv.Itoa(agentnet.Port))
	allowPodToPod(t)
	createPod(t, "agent-stranger", podYAML("agent-stranger", nil, "  containers:\n"+container("main", "exec sleep 3600", "")))
	waitPod(t, "agent-stranger", 3*time.Minute, "running", running)
	// 64 bytes where the handshake wants a nonce and a proof, then a
	// request in the clear.
	// (Its input stays open a while, for the agent to answer.)
	attack := `(printf '%064d{"args":["/bin/sh","-c","echo pwned >/tmp/pwned"]}' 0; sleep 3) | nc ` + p.Status.PodIP + " " + strconv.Itoa(agentnet.Port) + " | wc -c"
	out, err := cl.kubectl(nil, "exec", "agent-stranger", "--", "sh", "-c", attack)
	if strings.TrimSpace(out) != strconv.Itoa(len(agentnet.Hello)+32) || err != nil {
		t.Errorf("another pod without the key got %q bytes from the agent (%v), want its hello (%d) and no more", out, err, len(agentnet.Hello)+32)
	}
	key, _ := hex.DecodeString(hexKey)
	guess := bytes.Clone(key)
	guess[0] ^= 1
	if _, _, err := agentExec(addr, guess, "/bin/sh", "-c", "echo pwned >/tmp/pwned"); !errors.Is(err, agentnet.ErrAuth) {
		t.Errorf("a client with a wrong key: %v, want refused", err)
	}
	code, out, err := agentExec(addr, key, "/bin/sh", "-c", "test ! -e /tmp/pwned && echo absent")
	if err != nil || code != 0 || out != "absent\n" {
		t.Errorf("with the key: %d %q %v; want /tmp/pwned absent (nothing ran for the strangers)", code, out, err)
	}
}

// allowPodToPod lets the test cluster's pods reach each other through the
// host for the rest of the test. A host where hutch turned IPv4 forwarding
// on has hutch's guard table, which forwards nothing between interfaces
// that are not hutch's links (the CNI plugin's veths are not); a Kubernetes
// node routes between its pods. The rule accepts only the cluster's pod
// subnet to itself.
func allowPodToPod(t *testing.T) {
	t.Helper()
	if exec.Command("nft", "list", "chain", "inet", "hutch_forward", "forward").Run() != nil {
		return
	}
	out, err := exec.Command("nft", "-a", "-e", "insert", "rule", "inet", "hutch_forward", "forward",
		"ip", "saddr", podSubnet, "ip", "daddr", podSubnet, "accept").CombinedOutput()
	if err != nil {
		t.Fatalf("nft: let pods reach each other: %v\n%s", err, out)
	}
	_, h, ok := strings.Cut(string(out), "# handle ")
	if !ok {
		t.Fatalf("nft did not echo the rule's handle: %s", out)
	}
	handle := strings.Fields(h)[0]
	t.Cleanup(func() {
		if out, err := exec.Command("nft", "delete", "rule", "inet", "hutch_forward", "forward", "handle", handle).CombinedOutput(); err != nil {
			t.Errorf("nft: remove the pod-to-pod rule: %v\n%s", err, out)
		}
	})
}

// A template on Kubernetes starts cold with its start command: a create
// answers once the command's ready check passes, so the server listens
// from the first request; a template whose check never passes fails its
// create with the check's output and leaves no pod.
func TestServeTemplateOnKubernetes(t *testing.T) {
	s := newKubeServe(t)
	key := s.tenantAdd("tpl")
	s.start(kubeBackend(
		"--template", "web="+busyboxImage,
		"--template-start", "web=mkdir -p /www && echo hi > /www/hi && sleep 1 && exec httpd -f -p 8000 -h /www",
		"--template-ready", "web=port:8000",
		"--template", "never="+busyboxImage,
		"--template-start", "never=echo warming up; sleep 600",
		"--template-ready", "never=cmd:echo not ready yet; false",
		"--template-ready-timeout", "5s",
		"--pod-cpus", "0.25", "--pod-memory", "256m")...)
	for _, network := range []bool{false, true} {
		req := `{"templateID":"web","timeout":300}` // the server's default: no network
		if network {
			req = `{"templateID":"web","timeout":300,"allow_internet_access":true}`
		}
		code, body := s.api("POST", "/sandboxes", key, req)
		if code != http.StatusCreated {
			t.Fatalf("create of the template (network %t): %d %s\nserver log:\n%s", network, code, body, s.logTail())
		}
		var sb struct {
			SandboxID string `json:"sandboxID"`
		}
		if err := json.Unmarshal([]byte(body), &sb); err != nil {
			t.Fatal(err)
		}
		pod := "hutch-" + sb.SandboxID
		t.Cleanup(func() {
			cl.kubectl(nil, "delete", "pod", pod, "--ignore-not-found", "--grace-period=1", "--timeout=90s") //nolint:errcheck // best effort
		})
		// The first request, no retry: the create waited for ready.
		if out := kubectl(t, "exec", pod, "--", "wget", "-qO-", "http://127.0.0.1:8000/hi"); out != "hi\n" {
			t.Errorf("the template's server right after create (network %t): %q, want hi", network, out)
		}
	}
	code, body := s.api("POST", "/sandboxes", key, `{"templateID":"never","timeout":300}`)
	if code < 400 || !strings.Contains(body, "not ready yet") || !strings.Contains(body, "warming up") {
		t.Errorf("create of a template that never gets ready: %d %s, want an error with the check's and the command's output", code, body)
	}
	for deadline := time.Now().Add(90 * time.Second); ; time.Sleep(time.Second) {
		out := kubectl(t, "get", "pods", "-l", "app.kubernetes.io/managed-by=hutch-serve", "-o", "jsonpath={range .items[*]}{.metadata.annotations.hutch\\.dev/template}{\"\\n\"}{end}")
		if !strings.Contains(out, "never") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the pod of the template that never got ready is still there:\n%s", out)
		}
	}
}
