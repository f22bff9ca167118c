package k8s

import (
	"context"
	"flag"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"hutch.dev/hutch/client"
	"hutch.dev/hutch/integration/bench/benchdoc"
	"hutch.dev/hutch/serve/envdpb/processpb"
)

// The benchmark of `hutch serve --backend kubernetes` against `hutch serve` on
// one host: create → first output of a command, and a command's round trip
// in a running sandbox, through the same client and image. It is not a
// test: it runs only with HUTCH_K8S_BENCH=1 (`make k8s-bench`) and writes
// its section of docs/benchmarks.md when given -out.

var (
	benchOut = flag.String("out", "", "with HUTCH_K8S_BENCH=1: markdown file whose serve-kube section TestBenchServeKube (re)writes")
	benchN   = flag.Int("bench-n", 10, "with HUTCH_K8S_BENCH=1: measured creates per backend")
)

// benchSide is one backend's server and what was measured through it.
type benchSide struct {
	name    string
	s       *kubeServe
	c       *client.Client
	kube    bool
	create  []float64 // seconds
	command []float64
}

func TestBenchServeKube(t *testing.T) {
	if os.Getenv("HUTCH_K8S_BENCH") == "" {
		t.Skip("a benchmark, not a test: run it with `make k8s-bench` (HUTCH_K8S_BENCH=1)")
	}
	if *benchN < 1 {
		t.Fatalf("-bench-n %d: want at least 1", *benchN)
	}
	started := time.Now()
	load0 := loadAverage()
	// Both with the E2B API's defaults: 2 cores and 2 GiB a sandbox.
	local := startServedHutch(t, "--backend", "local")
	kube := startKubeBackend(t)
	sides := []*benchSide{
		{name: "`hutch serve` (local)", s: local},
		{name: "`hutch serve --backend kubernetes`", s: kube, kube: true},
	}
	for _, b := range sides {
		b.c = &client.Client{APIURL: "http://" + b.s.addr(), APIKey: b.s.key}
	}
	t.Cleanup(func() {
		if out, err := exec.Command(filepath.Join(cl.bin, "hutch"), "--root", filepath.Join(local.dir, "root"), "ls", "-q").Output(); err == nil {
			for _, id := range strings.Fields(string(out)) {
				exec.Command(filepath.Join(cl.bin, "hutch"), "--root", filepath.Join(local.dir, "root"), "rm", "-f", id).Run() //nolint:errcheck // best effort
			}
		}
		cl.kubectl(nil, "delete", "pods", "-l", "app.kubernetes.io/managed-by=hutch-serve", "--grace-period=1", "--timeout=120s") //nolint:errcheck // best effort
	})

	// Create → first output: one untimed round, then n rounds alternating
	// which backend goes first.
	const warmup, commands = 1, 30
	for i := -warmup; i < *benchN; i++ {
		for k := range sides {
			b := sides[(i+warmup+k)%len(sides)]
			d, err := b.createEcho()
			if err != nil {
				t.Fatalf("%s, create %d: %v\n%s", b.name, i, err, b.s.logTail())
			}
			if i >= 0 {
				b.create = append(b.create, d.Seconds())
			}
		}
	}

	// A command's round trip in one running sandbox of each.
	ctx := context.Background()
	running := map[*benchSide]*client.Sandbox{}
	for _, b := range sides {
		sb, err := b.c.Create(ctx, client.CreateRequest{TemplateID: "busybox", Timeout: 900})
		if err != nil {
			t.Fatalf("%s: create: %v", b.name, err)
		}
		running[b] = sb
	}
	for i := -warmup; i < commands; i++ {
		for k := range sides {
			b := sides[(i+warmup+k)%len(sides)]
			d, err := echo(ctx, running[b])
			if err != nil {
				t.Fatalf("%s, command %d: %v", b.name, i, err)
			}
			if i >= 0 {
				b.command = append(b.command, d.Seconds())
			}
		}
	}
	for _, b := range sides {
		if err := b.c.Kill(ctx, running[b].ID); err != nil {
			t.Errorf("%s: kill: %v", b.name, err)
		}
	}

	var w strings.Builder
	p := func(format string, a ...any) { fmt.Fprintf(&w, format, a...) }
	p("## `hutch serve --backend kubernetes` beside `hutch serve` on one host\n\n")
	invocation := "`make k8s-bench` (`HUTCH_K8S=1 HUTCH_K8S_BENCH=1 go test -count=1 -run TestBenchServeKube ./integration/k8s/ -out docs/benchmarks.md`)"
	if *benchN != 10 {
		invocation = fmt.Sprintf("`HUTCH_K8S=1 HUTCH_K8S_BENCH=1 go test -count=1 -run TestBenchServeKube ./integration/k8s/ -out docs/benchmarks.md -bench-n %d`", *benchN)
	}
	p("Produced by %s on %s, as root, in %s. Machine: %d CPUs, %s. Load average (1 min) at start %s, at end %s. "+
		"The machine is shared: compare rows of one run, not runs.\n\n",
		invocation, started.UTC().Format("2006-01-02 15:04 UTC"), time.Since(started).Round(time.Second),
		runtime.NumCPU(), runtime.GOOS+"/"+runtime.GOARCH, load0, loadAverage())
	p("Two servers on 127.0.0.1, each with one tenant, driven by the same client (the Go client, `hutch.dev/hutch/client`, "+
		"which speaks E2B's REST API and envd's process service as the E2B SDKs do), template `busybox` on both: the local one runs "+
		"each sandbox on this host; the Kubernetes one makes each a pod with `runtimeClassName: hutch` on the single-node cluster "+
		"of the end-to-end tests (apiserver, scheduler and kubelet on the same machine), its commands through `pods/exec`. "+
		"Sandboxes have E2B's defaults on both (2 cores, 2 GiB: the pod's requests and limits on Kubernetes). "+
		"The backends alternate which goes first each round, after %d untimed round; p95 is by nearest rank.\n\n", warmup)
	p("### Create → first output\n\n")
	p("`POST /sandboxes`, then the process service's `Start` of `/bin/echo hi`, to the first byte of its output. " +
		"The sandbox is killed after the clock stops, and on Kubernetes its pod is gone before the next create.\n\n")
	benchTable(&w, sides, func(b *benchSide) []float64 { return b.create })
	p("### `/bin/echo hi` → exit in a running sandbox\n\n")
	p("`Start` of `/bin/echo hi` to the end event, output checked, in one sandbox of each backend.\n\n")
	benchTable(&w, sides, func(b *benchSide) []float64 { return b.command })
	section := w.String()
	t.Log("\n" + section)
	if *benchOut == "" {
		return
	}
	out := *benchOut
	if !filepath.IsAbs(out) {
		out = filepath.Join(cl.repo, out)
	}
	if err := benchdoc.WriteSection(out, "serve-kube", section); err != nil {
		t.Fatal(err)
	}
	t.Logf("wrote %s", out)
}

// createEcho times a create and the first output of /bin/echo hi in the
// new sandbox, then kills it; on Kubernetes it waits (untimed) until the
// pod is gone.
func (b *benchSide) createEcho() (time.Duration, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	t0 := time.Now()
	sb, err := b.c.Create(ctx, client.CreateRequest{TemplateID: "busybox", Timeout: 600})
	if err != nil {
		return 0, err
	}
	d, err := firstOutput(ctx, sb, t0)
	if kerr := b.c.Kill(ctx, sb.ID); kerr != nil && err == nil {
		err = fmt.Errorf("kill: %w", kerr)
	}
	if err != nil || !b.kube {
		return d, err
	}
	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(200 * time.Millisecond) {
		out, kerr := cl.kubectl(nil, "get", "pod", "hutch-"+sb.ID, "--ignore-not-found", "-o", "name")
		if kerr == nil && strings.TrimSpace(out) == "" {
			return d, nil
		}
		if time.Now().After(deadline) {
			return d, fmt.Errorf("pod hutch-%s not gone 2 minutes after kill", sb.ID)
		}
	}
}

// startEchoHi starts /bin/echo hi (no shell) in sb through the process
// service.
func startEchoHi(ctx context.Context, sb *client.Sandbox) (*connect.ServerStreamForClient[processpb.StartResponse], error) {
	no := false
	return sb.Process("root").Start(ctx, connect.NewRequest(&processpb.StartRequest{
		Process: &processpb.ProcessConfig{Cmd: "/bin/echo", Args: []string{"hi"}},
		Stdin:   &no,
	}))
}

// firstOutput is the time from t0 to the first byte /bin/echo hi prints
// in sb; it reads the command to its end and checks its output and exit.
func firstOutput(ctx context.Context, sb *client.Sandbox, t0 time.Time) (time.Duration, error) {
	stream, err := startEchoHi(ctx, sb)
	if err != nil {
		return 0, err
	}
	defer stream.Close()
	var d time.Duration
	var out []byte
	for stream.Receive() {
		ev := stream.Msg().GetEvent()
		if o := ev.GetData().GetStdout(); len(o) > 0 {
			if out == nil {
				d = time.Since(t0)
			}
			out = append(out, o...)
		}
		if e := ev.GetEnd(); e != nil {
			if e.GetExitCode() != 0 || string(out) != "hi\n" {
				return d, fmt.Errorf("exit %d, stdout %q; want 0, hi", e.GetExitCode(), out)
			}
			return d, nil
		}
	}
	return 0, fmt.Errorf("stream ended without an end event: %v", stream.Err())
}

// echo times /bin/echo hi in sb from the request to its end event.
func echo(ctx context.Context, sb *client.Sandbox) (time.Duration, error) {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	t0 := time.Now()
	if _, err := firstOutput(ctx, sb, t0); err != nil {
		return 0, err
	}
	return time.Since(t0), nil
}

// benchTable renders the median, p95, min and count of each side's runs.
func benchTable(w *strings.Builder, sides []*benchSide, runs func(*benchSide) []float64) {
	fmt.Fprintf(w, "| server | median | p95 | min | runs |\n|---|---:|---:|---:|---:|\n")
	var med []float64
	for _, b := range sides {
		v := append([]float64(nil), runs(b)...)
		sort.Float64s(v)
		med = append(med, nearestRank(v, 0.5))
		fmt.Fprintf(w, "| %s | %s | %s | %s | %d |\n", b.name, benchMS(nearestRank(v, 0.5)), benchMS(nearestRank(v, 0.95)), benchMS(v[0]), len(v))
	}
	fmt.Fprintf(w, "\nDifference of medians, Kubernetes − local: %+.1f ms.\n\n", (med[1]-med[0])*1000)
}

// nearestRank is quantile q of sorted by nearest rank.
func nearestRank(sorted []float64, q float64) float64 {
	i := int(math.Ceil(q*float64(len(sorted)))) - 1
	return sorted[max(i, 0)]
}

func benchMS(s float64) string {
	if v := s * 1000; v < 10 {
		return fmt.Sprintf("%.2f ms", v)
	}
	return fmt.Sprintf("%.1f ms", s*1000)
}

func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	return strings.Fields(string(b))[0]
}
