package integration

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"io/fs"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
)

// statsRecord is `hutch stats --format json`.
type statsRecord struct {
	CPU struct {
		UsageNs uint64  `json:"usageNs"`
		Percent float64 `json:"percent"`
		Limit   float64 `json:"limit"`
	} `json:"cpu"`
	Memory struct {
		Usage    uint64 `json:"usage"`
		Limit    uint64 `json:"limit"`
		OOMKills uint64 `json:"oomKills"`
	} `json:"memory"`
	Pids struct {
		Current   int    `json:"current"`
		Limit     int64  `json:"limit"`
		HostTasks uint64 `json:"hostTasks"`
		HostLimit uint64 `json:"hostLimit"`
	} `json:"pids"`
	Disk struct {
		Used  uint64 `json:"used"`
		Limit int64  `json:"limit"`
	} `json:"disk"`
}

func (e *env) stats(id string) statsRecord {
	e.t.Helper()
	var s statsRecord
	if err := json.Unmarshal([]byte(e.ok("stats", "--format", "json", id)), &s); err != nil {
		e.t.Fatalf("stats %s: %v", id, err)
	}
	return s
}

// copyIn writes the host file src into the sandbox at dst, executable.
func (e *env) copyIn(id, src, dst string) {
	e.t.Helper()
	f, err := os.Open(src)
	if err != nil {
		e.t.Fatal(err)
	}
	defer f.Close()
	if r := e.run(f, "exec", "-i", id, "--", "sh", "-c", "cat > "+dst+" && chmod 755 "+dst); r.code != 0 {
		e.t.Fatalf("copy %s into %s: %s", src, id, r)
	}
}

// buildProbe builds integration/probe, static, for the sandbox.
func buildProbe(t *testing.T) string {
	t.Helper()
	out := filepath.Join(t.TempDir(), "probe")
	cmd := exec.Command("go", "build", "-o", out, "./probe")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build probe: %v: %s", err, b)
	}
	return out
}

// The limits a sandbox is created with are what its processes see and
// what the host enforces and reports.
func TestResourceLimits(t *testing.T) {
	e := newEnv(t)
	id := e.create("--cpus", "1.5", "--memory", "256m", "--pids", "64", "--disk", "64m")
	out := e.ok("exec", id, "--", "sh", "-c", "nproc; grep MemTotal /proc/meminfo; ulimit -u")
	f := strings.Fields(out)
	// gVisor reports ceil(cpus) CPUs, at least 2 and at most the host's.
	wantCPUs := min(max(2, int(math.Ceil(1.5))), runtime.NumCPU())
	if len(f) != 5 || f[0] != strconv.Itoa(wantCPUs) || f[2] != strconv.Itoa(256<<10) || f[4] != "64" {
		t.Fatalf("inside: nproc, MemTotal (kB), ulimit -u = %q; want %d, %d, 64", out, wantCPUs, 256<<10)
	}
	cg := func(ctrl, file string) string {
		b, err := os.ReadFile(filepath.Join("/sys/fs/cgroup", ctrl, "hutch", id, file))
		if err != nil {
			t.Fatal(err)
		}
		return strings.TrimSpace(string(b))
	}
	if q := cg("cpu", "cpu.cfs_quota_us"); q != "150000" {
		t.Errorf("cpu.cfs_quota_us = %s, want 150000", q)
	}
	if m := cg("memory", "memory.limit_in_bytes"); m != strconv.Itoa(256<<20) {
		t.Errorf("memory.limit_in_bytes = %s", m)
	}
	e.ok("exec", id, "--", "dd", "if=/dev/zero", "of=/data", "bs=1M", "count=16")
	s := e.stats(id)
	if s.CPU.Limit != 1.5 || s.Memory.Limit != 256<<20 || s.Memory.Usage == 0 || s.CPU.UsageNs == 0 ||
		s.Pids.Limit != 64 || s.Pids.Current < 1 || s.Pids.HostTasks == 0 || s.Pids.HostLimit <= 64 ||
		s.Disk.Limit != 64<<20 || s.Disk.Used < 16<<20 || s.Disk.Used > 64<<20+4<<20 {
		t.Fatalf("stats: %+v", s)
	}
	table := e.ok("stats", id)
	if !strings.Contains(table, id[:12]) || !strings.Contains(table, "256MiB") {
		t.Fatalf("stats table: %q", table)
	}
	e.ok("rm", "-f", id)
	e.assertClean(id)
	assertOneLineError(t, e.run(nil, "stats", id), "no such sandbox")
}

// Every rule of the seccomp profile, tried from inside a sandbox by a
// probe program: denied calls fail with EPERM; what agents do still works.
func TestSeccompProfile(t *testing.T) {
	e := newEnv(t)
	probe := buildProbe(t)
	id := e.create()
	e.copyIn(id, probe, "/probe")
	for _, user := range []string{"0", "1000"} {
		r := e.run(nil, "exec", "-u", user, id, "--", "/probe")
		if r.code != 0 {
			t.Fatalf("probe as %s: %s", user, r)
		}
		var got map[string]string
		if err := json.Unmarshal([]byte(r.stdout), &got); err != nil {
			t.Fatalf("probe output %q: %v", r.stdout, err)
		}
		for _, op := range []string{
			"socket_packet", "socket_raw", "socket_raw6", "socket_vsock", "add_key", "keyctl", "request_key",
			"bpf", "mount", "umount", "pivot_root", "kexec_load", "init_module", "delete_module",
			"perf_event_open", "userfaultfd", "io_uring_setup", "unshare_user", "unshare_net", "setns",
			"clone_newuser", "clone_newns", "ptrace_attach", "ptrace_seize", "process_vm_readv",
		} {
			if got[op] != "EPERM" {
				t.Errorf("as uid %s: %s: %q, want EPERM", user, op, got[op])
			}
		}
		for _, op := range []string{"fork_exec", "ptrace_traceme_child", "tcp_loopback", "udp_socket", "unix_socketpair", "netlink_route", "file_io"} {
			if got[op] != "ok" {
				t.Errorf("as uid %s: %s: %q, want ok", user, op, got[op])
			}
		}
	}
}

// searchTree fails the test if any regular file under dir holds needle.
func searchTree(t *testing.T, dir string, needles ...[]byte) {
	t.Helper()
	filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return nil
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return nil
		}
		for _, n := range needles {
			if bytes.Contains(b, n) {
				t.Errorf("secret found in %s", p)
			}
		}
		return nil
	})
}

func randomSecret(t *testing.T) string {
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return "s3cret-" + hex.EncodeToString(b)
}

// Secrets reach the sandbox's processes, as environment and as files,
// and nowhere else: not in anything hutch wrote on disk (its state root, its
// temporary files, the sandbox's overlay file) nor in anything it printed.
func TestSecretsNeverLeak(t *testing.T) {
	e := newEnv(t)
	tmp := t.TempDir()
	e.extra = append(e.extra, "TMPDIR="+tmp)
	fileVal, envVal, typoVal := randomSecret(t), randomSecret(t), randomSecret(t)
	secretFile := filepath.Join(t.TempDir(), "key")
	if err := os.WriteFile(secretFile, []byte(fileVal), 0o600); err != nil {
		t.Fatal(err)
	}
	e.extra = append(e.extra, "HUTCH_TEST_TOKEN="+envVal)
	needles := [][]byte{[]byte(fileVal), []byte(envVal), []byte(typoVal)}
	var printed bytes.Buffer
	record := func(r result) result {
		printed.WriteString(r.stdout)
		printed.WriteString(r.stderr)
		return r
	}

	r := record(e.run(nil, "create", "--image", "busybox", "--secret", "API_KEY=@"+secretFile, "--secret", "TOKEN=env:HUTCH_TEST_TOKEN"))
	if r.code != 0 {
		t.Fatalf("create: %s", r)
	}
	id := strings.TrimSpace(r.stdout)
	for _, user := range []string{"", "1000:1000"} {
		args := []string{"exec", id, "--", "sh", "-c", `printf '%s %s\n' "$API_KEY" "$TOKEN"`}
		if user != "" {
			args = []string{"exec", "-u", user, id, "--", "sh", "-c", `id -u; printf '%s %s\n' "$API_KEY" "$TOKEN"`}
		}
		r := e.run(nil, args...)
		if !strings.HasSuffix(r.stdout, fileVal+" "+envVal+"\n") || r.code != 0 {
			t.Fatalf("exec as %q does not see the secrets in its environment: %s", user, r)
		}
	}
	r = e.run(nil, "exec", id, "--", "sh", "-c", "stat -c '%a %U' /run/secrets/API_KEY; cat /run/secrets/API_KEY /run/secrets/TOKEN")
	if r.code != 0 || r.stdout != "400 root\n"+fileVal+envVal {
		t.Fatalf("/run/secrets: %s", r)
	}
	if r := e.run(nil, "exec", "-u", "1000", id, "--", "cat", "/run/secrets/API_KEY"); r.code == 0 {
		t.Fatalf("a non-root user reads /run/secrets/API_KEY: %s", r)
	}
	// What hutch prints about the sandbox names the secrets, never their values.
	insp := record(e.run(nil, "inspect", id))
	if !strings.Contains(insp.stdout, `"API_KEY"`) || !strings.Contains(insp.stdout, `"TOKEN"`) {
		t.Fatalf("inspect does not name the secrets: %s", insp)
	}
	for _, args := range [][]string{
		{"ls", "--format", "json"}, {"ls"}, {"stats", id}, {"stats", "--format", "json", id},
		{"create", "--secret", "TOKEN=" + typoVal},
		{"create", "--secret", "TOKEN=@/no/such/file"},
		{"create", "--secret", "lower=@" + secretFile},
		{"create", "--secret", "A=env:HUTCH_TEST_UNSET", "--secret", "TOKEN=env:HUTCH_TEST_TOKEN"},
		{"create", "--secret", "TOKEN=env:HUTCH_TEST_TOKEN", "--secret", "TOKEN=@" + secretFile},
		{"create", "--secret", "TOKEN=env:HUTCH_TEST_TOKEN", "--env", "TOKEN=x"},
		{"exec", id, "--", "no-such-command"},
	} {
		record(e.run(nil, args...))
	}
	// The overlay file that holds the sandbox's writes (deleted on the
	// host, open in the sandbox process).
	pid := e.inspect(id).Pid
	fds, _ := filepath.Glob("/proc/" + strconv.Itoa(pid) + "/fd/*")
	for _, fd := range fds {
		if l, _ := os.Readlink(fd); strings.Contains(l, "runsc-filestore") {
			b, err := os.ReadFile(fd)
			if err != nil {
				t.Fatal(err)
			}
			for _, n := range needles {
				if bytes.Contains(b, n) {
					t.Errorf("secret found in the sandbox's overlay file")
				}
			}
		}
	}
	searchTree(t, e.root, needles...)
	searchTree(t, tmp, needles...)
	record(e.run(nil, "stop", id))
	searchTree(t, e.root, needles...)
	for _, n := range needles {
		if bytes.Contains(printed.Bytes(), n) {
			t.Errorf("hutch printed a secret's value:\n%s", printed.String())
		}
	}
	record(e.run(nil, "rm", id))
	e.assertClean(id)
}
