package k8s

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// Load on the Kubernetes backend: 20 E2B SDK clients at once, each with a
// sandbox of its own (a pod), run 50 commands each through `hutch serve
// --backend kubernetes`. Every command prints a payload unique to it (some
// a few KiB, some on stderr, some with an exit status); every byte and
// status is checked, and a log each command appends to in its sandbox
// shows that each ran exactly once. Afterwards no sandbox is listed and no
// pod is left. It runs only with HUTCH_K8S_LOAD=1 (`make k8s-load`).

// startServedHutch starts `hutch serve` with one tenant (its key in key) and
// args after the common flags, and waits until it answers.
func startServedHutch(t *testing.T, args ...string) *kubeServe {
	t.Helper()
	s := newKubeServe(t)
	s.key = s.tenantAdd("load")
	s.start(args...)
	return s
}

// startKubeBackend starts `hutch serve --backend kubernetes` on the test
// cluster, templates base and busybox mapped to busybox, with more flags.
func startKubeBackend(t *testing.T, flags ...string) *kubeServe {
	t.Helper()
	return startServedHutch(t, kubeBackend(append([]string{"--template", "base=" + busyboxImage, "--template", "busybox=" + busyboxImage}, flags...)...)...)
}

// list is the IDs GET /sandboxes answers for the server's tenant.
func (s *kubeServe) list() []string {
	s.t.Helper()
	req, _ := http.NewRequest("GET", "http://"+s.addr()+"/sandboxes", nil)
	req.Header.Set("X-API-Key", s.key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		s.t.Fatal(err)
	}
	defer resp.Body.Close()
	var got []struct {
		SandboxID string `json:"sandboxID"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&got); err != nil || resp.StatusCode != http.StatusOK {
		s.t.Fatalf("GET /sandboxes: %d, %v", resp.StatusCode, err)
	}
	var ids []string
	for _, g := range got {
		ids = append(ids, g.SandboxID)
	}
	return ids
}

// bashStub makes /bin/bash in the pod a shell that hands its arguments to
// busybox sh: E2B's SDKs run every command with /bin/bash.
func bashStub(pod string) error {
	_, err := cl.kubectl(nil, "exec", pod, "--", "sh", "-c", `printf '#!/bin/sh\nexec /bin/sh "$@"\n' >/bin/bash && chmod +x /bin/bash`)
	return err
}

// loadScript is the node side of TestServeKubeLoad. It creates CLIENTS
// sandboxes at once and prints "CREATED id..."; after a line on stdin
// (/bin/bash is in place) each client runs COMMANDS commands in its own
// sandbox, all clients at once, checking every byte as returned and as
// streamed, and prints "RESULT {json}"; after a second line it kills every
// sandbox.
const loadScript = `
import { Sandbox, CommandExitError } from 'E2B_SDK'
import readline from 'node:readline'

const nClients = Number(process.env.CLIENTS)
const nCommands = Number(process.env.COMMANDS)
const lines = readline.createInterface({ input: process.stdin })[Symbol.asyncIterator]()

// What command i of client c prints and exits with. Every output names
// the command; the kinds rotate: a line, stderr and a status, a few KiB, a
// few KiB on both streams with a status, a line with a status.
function expected(c, i) {
  const tag = 'c' + c + '-' + i
  const n = 40 + ((c * 7 + i) % 60)
  const block = (p) => Array.from({ length: n }, (_, k) => p + ' ' + tag + ' line ' + (k + 1) + ' of ' + n + ' ................................\n').join('')
  const loop = (p, fd) => 'k=1; while [ $k -le ' + n + ' ]; do echo "' + p + ' ' + tag + ' line $k of ' + n + ' ................................"' + fd + '; k=$((k+1)); done'
  const log = 'echo ' + tag + ' >>/tmp/ran; '
  switch (i % 5) {
  case 0: return { cmd: log + 'echo out ' + tag, stdout: 'out ' + tag + '\n', stderr: '', exitCode: 0 }
  case 1: return { cmd: log + 'echo err ' + tag + ' >&2; exit ' + (1 + i % 9), stdout: '', stderr: 'err ' + tag + '\n', exitCode: 1 + i % 9 }
  case 2: return { cmd: log + loop('kib', ''), stdout: block('kib'), stderr: '', exitCode: 0 }
  case 3: return { cmd: log + loop('o', '') + '; ' + loop('e', ' >&2') + '; exit 42', stdout: block('o'), stderr: block('e'), exitCode: 42 }
  default: return { cmd: log + 'printf "%s\\n" "last ' + tag + '"; exit ' + (100 + c), stdout: 'last ' + tag + '\n', stderr: '', exitCode: 100 + c }
  }
}

const sandboxes = await Promise.all(Array.from({ length: nClients }, () =>
  Sandbox.create('base', { timeoutMs: 900_000, metadata: { suite: 'k8s-load' }, requestTimeoutMs: 240_000 })))
console.log('CREATED ' + sandboxes.map((s) => s.sandboxId).join(' '))
await lines.next()

const failures = []
const latencies = []
let bytes = 0
let commands = 0
const t0 = Date.now()
await Promise.all(sandboxes.map(async (hutch, c) => {
  for (let i = 0; i < nCommands; i++) {
    const want = expected(c, i)
    let streamedOut = ''
    let streamedErr = ''
    let res
    const start = Date.now()
    try {
      res = await hutch.commands.run(want.cmd, {
        onStdout: (d) => { streamedOut += d }, onStderr: (d) => { streamedErr += d },
        timeoutMs: 120_000, requestTimeoutMs: 120_000,
      })
    } catch (e) {
      if (!(e instanceof CommandExitError)) {
        failures.push('client ' + c + ' command ' + i + ': ' + e)
        continue
      }
      res = e
    }
    latencies.push(Date.now() - start)
    commands++
    const got = { stdout: res.stdout, stderr: res.stderr, exitCode: res.exitCode }
    for (const k of ['stdout', 'stderr', 'exitCode']) {
      if (got[k] !== want[k]) failures.push('client ' + c + ' command ' + i + ' ' + k + ': got ' + JSON.stringify(got[k]).slice(0, 200) + ', want ' + JSON.stringify(want[k]).slice(0, 200))
    }
    if (streamedOut !== want.stdout || streamedErr !== want.stderr) failures.push('client ' + c + ' command ' + i + ': the streamed output differs from the result')
    bytes += want.stdout.length + want.stderr.length
  }
  // Each command ran once: the sandbox's log names each exactly once, in order.
  const ran = await hutch.files.read('/tmp/ran')
  const want = Array.from({ length: nCommands }, (_, i) => 'c' + c + '-' + i + '\n').join('')
  if (ran !== want) failures.push('client ' + c + ': the commands that ran were ' + JSON.stringify(ran).slice(0, 300))
}))
const elapsed = Date.now() - t0
latencies.sort((a, b) => a - b)
const q = (p) => latencies[Math.max(0, Math.ceil(p * latencies.length) - 1)]
console.log('RESULT ' + JSON.stringify({ failures, commands, bytes, elapsed, p50: q(0.5), p95: q(0.95), max: q(1) }))

await lines.next()
const killed = await Promise.all(sandboxes.map((s) => Sandbox.kill(s.sandboxId)))
console.log('KILLED ' + killed.filter((k) => k === true).length)
`

// loadResult is the RESULT line of loadScript.
type loadResult struct {
	Failures []string `json:"failures"`
	Commands int      `json:"commands"`
	Bytes    int      `json:"bytes"`
	Elapsed  int      `json:"elapsed"`
	P50      int      `json:"p50"`
	P95      int      `json:"p95"`
	Max      int      `json:"max"`
}

func TestServeKubeLoad(t *testing.T) {
	if os.Getenv("HUTCH_K8S_LOAD") == "" {
		t.Skip("about three minutes of a loaded host: run it with `make k8s-load` (HUTCH_K8S_LOAD=1)")
	}
	const clients, commands = 20, 50
	node, err := exec.LookPath("node")
	if err != nil {
		t.Fatal("node is not installed (scripts/install-deps.sh installs it)")
	}
	sdk := filepath.Join(cl.repo, "integration", "e2b", "node_modules", "e2b", "dist", "index.mjs")
	if _, err := os.Stat(sdk); err != nil {
		t.Fatalf("the E2B SDK is not installed (make e2b-sdk): %v", err)
	}
	// 20 pods of 0.05 cores fit the test node beside what else runs.
	s := startKubeBackend(t, "--pod-cpus", "0.05", "--pod-memory", "128m")
	script := filepath.Join(s.dir, "load.mjs")
	if err := os.WriteFile(script, []byte(strings.Replace(loadScript, "E2B_SDK", "file://"+sdk, 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, script)
	cmd.Env = append(os.Environ(), "CLIENTS="+strconv.Itoa(clients), "COMMANDS="+strconv.Itoa(commands), "E2B_API_KEY="+s.key,
		"E2B_API_URL=http://"+s.addr(), "E2B_SANDBOX_URL=http://"+s.addr(), "E2B_DOMAIN=e2e.hutch.test")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	defer stdin.Close()
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Wait()         //nolint:errcheck // checked below when the script got that far
	defer cmd.Process.Kill() //nolint:errcheck // a no-op once it exited
	sc := bufio.NewScanner(stdout)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	// line reads the script's next line that starts with prefix.
	line := func(prefix string) string {
		t.Helper()
		for sc.Scan() {
			if rest, ok := strings.CutPrefix(sc.Text(), prefix+" "); ok {
				return rest
			}
			t.Logf("node: %s", sc.Text())
		}
		cmd.Process.Kill() //nolint:errcheck // it is past saving
		cmd.Wait()         //nolint:errcheck // its stderr says why
		t.Fatalf("the SDK script ended before %s: %v\n%s\nserver log:\n%s", prefix, sc.Err(), stderr.String(), s.logTail())
		return ""
	}

	t0 := time.Now()
	ids := strings.Fields(line("CREATED"))
	t.Logf("%d sandboxes created at once in %s", len(ids), time.Since(t0).Round(time.Millisecond))
	if len(ids) != clients {
		t.Fatalf("created %d sandboxes, want %d", len(ids), clients)
	}
	t.Cleanup(func() {
		args := []string{"delete", "pod", "--ignore-not-found", "--grace-period=1", "--timeout=120s"}
		for _, id := range ids {
			args = append(args, "hutch-"+id)
		}
		cl.kubectl(nil, args...) //nolint:errcheck // best effort; the cluster's stop checks the host
	})
	var wg sync.WaitGroup
	errs := make([]error, len(ids))
	for i, id := range ids {
		wg.Add(1)
		go func() { defer wg.Done(); errs[i] = bashStub("hutch-" + id) }()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}

	fmt.Fprintln(stdin)
	var res loadResult
	if err := json.Unmarshal([]byte(line("RESULT")), &res); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d clients × %d commands: %d commands, %d bytes of output, in %s; per command p50 %d ms, p95 %d ms, max %d ms",
		clients, commands, res.Commands, res.Bytes, time.Duration(res.Elapsed)*time.Millisecond, res.P50, res.P95, res.Max)
	for i, f := range res.Failures {
		if i == 20 {
			t.Errorf("... and %d more", len(res.Failures)-i)
			break
		}
		t.Error(f)
	}
	if res.Commands != clients*commands {
		t.Errorf("%d commands completed, want %d", res.Commands, clients*commands)
	}

	// Kill every sandbox: the server lists none, and their pods go.
	fmt.Fprintln(stdin)
	if n := line("KILLED"); n != strconv.Itoa(clients) {
		t.Errorf("kill answered true for %s of %d sandboxes", n, clients)
	}
	if left := s.list(); len(left) != 0 {
		t.Errorf("after killing every sandbox the server lists %v", left)
	}
	deadline := time.Now().Add(2 * time.Minute)
	for {
		out, err := cl.kubectl(nil, "get", "pods", "-l", "app.kubernetes.io/managed-by=hutch-serve", "-o", "name")
		if err == nil && strings.TrimSpace(out) == "" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("pods left 2 minutes after every sandbox was killed: %s %v", out, err)
		}
		time.Sleep(time.Second)
	}
	// Nor does the node keep their pod sandboxes.
	for _, id := range ids {
		for {
			out, err := cl.crictl("pods", "--name", "hutch-"+id, "-q")
			if err == nil && strings.TrimSpace(out) == "" {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("the node still has pod sandbox hutch-%s: %s %v", id, out, err)
			}
			time.Sleep(time.Second)
		}
	}
	t.Logf("load and clean-up took %s", time.Since(t0).Round(time.Second))
}
