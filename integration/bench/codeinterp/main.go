// Command codeinterp measures the code interpreter through `hutch serve`:
// create → the first runCode('1+1') result through the API, for a create
// restored from the code-interpreter-v1 template's checkpoint and for one
// claimed from a pool of it; the round trip of '1+1' on a warm context;
// and 50 concurrent clients across 10 sandboxes, every output byte
// checked. It writes its own section of docs/benchmarks.md. Run it
// through `make bench` (as root, after `make code-interpreter-image`).
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"math"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"hutch.dev/hutch/client"
	"hutch.dev/hutch/integration/bench/benchdoc"
	"hutch.dev/hutch/integration/bench/benchexit"
)

const template = "code-interpreter-v1"

type bench struct {
	bin, tmp, root string
	env            []string
	c              *client.Client
	srv            *exec.Cmd
	exited         chan struct{}
}

func main() {
	bin := flag.String("bin", "bin", "directory holding hutch, runsc and images/code-interpreter-v1.tar")
	out := flag.String("out", "", "markdown file whose codeinterp section is (re)written; empty: stdout only")
	createN := flag.Int("create-runs", 10, "creates measured per kind")
	rtN := flag.Int("runs", 300, "round trips measured on a warm context")
	keep := flag.Bool("keep", false, "on failure, keep the run's state root and the server's log")
	flag.Parse()
	started := time.Now()
	load0 := loadAverage()
	abs, err := filepath.Abs(*bin)
	if err != nil {
		benchexit.Fatal(err)
	}
	b, err := start(abs)
	benchexit.AtExit(func() {
		if *keep {
			fmt.Fprintf(os.Stderr, "codeinterp: kept %s (serve.log)\n", b.tmp)
			b.tmp = ""
		}
		b.cleanup()
	})
	if err != nil {
		benchexit.Fatal(err)
	}
	defer b.cleanup()
	ctx := context.Background()

	// The first create after the import makes the template's checkpoint:
	// not measured.
	progress("making the template's checkpoint")
	first, _, err := b.createAndRun(ctx)
	if err != nil {
		benchexit.Fatal(err)
	}
	var rec struct {
		Network string `json:"network"`
	}
	if out, err := b.hutch("inspect", "--format", "json", first.ID); err == nil {
		json.Unmarshal([]byte(out), &rec) //nolint:errcheck // the default below
	}
	netMode := "open"
	if rec.Network != "" {
		netMode = rec.Network
	}

	progress("create → first runCode('1+1'), restored from the template, %d runs", *createN)
	var restored []float64
	for i := 0; i < *createN; i++ {
		sb, d, err := b.createAndRun(ctx)
		if err != nil {
			benchexit.Fatal(err)
		}
		restored = append(restored, d.Seconds())
		b.c.Kill(ctx, sb.ID) //nolint:errcheck // best effort
	}

	progress("create → first runCode('1+1'), claimed from a pool, %d runs", *createN)
	if _, err := b.hutch("pool", "create", "--image", template, "--size", "2", "--net", netMode, "bench"); err != nil {
		benchexit.Fatal(err)
	}
	var pooled []float64
	for i := 0; i < *createN; i++ {
		members, err := b.waitPool(2, 5*time.Minute)
		if err != nil {
			benchexit.Fatal(err)
		}
		sb, d, err := b.createAndRun(ctx)
		if err != nil {
			benchexit.Fatal(err)
		}
		if !slices.Contains(members, sb.ID) {
			benchexit.Fatalf("the create made %s, not one of the pool's %v: the pool does not serve the API's creates", sb.ID, members)
		}
		pooled = append(pooled, d.Seconds())
		b.c.Kill(ctx, sb.ID) //nolint:errcheck // best effort
	}
	b.hutch("pool", "rm", "bench") //nolint:errcheck // the clean-up removes what is left

	progress("runCode('1+1') round trip on a warm context, %d runs", *rtN)
	code := first.Code()
	var rt []float64
	for i := 0; i < *rtN+20; i++ {
		t0 := time.Now()
		x, err := code.Execute(ctx, client.CodeRequest{Code: "1+1"}, nil)
		d := time.Since(t0)
		if err != nil || x.Text() != "2" {
			benchexit.Fatalf("runCode('1+1'): %v %+v", err, x)
		}
		if i >= 20 {
			rt = append(rt, d.Seconds())
		}
	}

	progress("50 concurrent clients across 10 sandboxes")
	conc, err := b.concurrent(ctx, 10, 50, 20)
	if err != nil {
		benchexit.Fatal(err)
	}

	body := render(report{
		started: started, elapsed: time.Since(started), load0: load0, load1: loadAverage(),
		restored: restored, pooled: pooled, rt: rt, conc: conc, createN: *createN,
	})
	fmt.Print(body)
	if *out != "" {
		if err := benchdoc.WriteSection(*out, "codeinterp", body); err != nil {
			benchexit.Fatal(err)
		}
	}
}

func progress(format string, a ...any) { fmt.Fprintf(os.Stderr, "codeinterp: "+format+"\n", a...) }

func start(bin string) (*bench, error) {
	archive := filepath.Join(bin, "images", template+".tar")
	if _, err := os.Stat(archive); err != nil {
		return &bench{}, fmt.Errorf("%w (run `make code-interpreter-image`)", err)
	}
	tmp, err := os.MkdirTemp("", "hutch-bench-codeinterp-")
	if err != nil {
		return &bench{}, err
	}
	b := &bench{bin: bin, tmp: tmp, root: filepath.Join(tmp, "hutch")}
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "HUTCH_") {
			b.env = append(b.env, kv)
		}
	}
	b.env = append(b.env, "HUTCH_ROOT="+b.root)
	if _, err := b.hutch("image", "import", template, archive); err != nil {
		return b, err
	}
	tenants := filepath.Join(tmp, "tenants")
	key, err := b.hutch("tenant", "add", "--tenants", tenants, "bench")
	if err != nil {
		return b, err
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return b, err
	}
	addr := l.Addr().String()
	l.Close()
	logf, err := os.Create(filepath.Join(tmp, "serve.log"))
	if err != nil {
		return b, err
	}
	defer logf.Close()
	b.srv = exec.Command(filepath.Join(bin, "hutch"), "serve", "--listen", addr, "--tenants", tenants, "--audit-log", "-")
	b.srv.Env = b.env
	b.srv.Stdout, b.srv.Stderr = logf, logf
	if err := b.srv.Start(); err != nil {
		return b, err
	}
	b.exited = make(chan struct{})
	go func() { b.srv.Wait(); close(b.exited) }() //nolint:errcheck // its status is in ProcessState
	b.c = &client.Client{APIURL: "http://" + addr, APIKey: strings.TrimSpace(key), HTTP: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}}
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if b.c.Health(context.Background()) == nil {
			return b, nil
		}
		select {
		case <-b.exited:
			return b, fmt.Errorf("hutch serve exited: %v (log %s)", b.srv.ProcessState, logf.Name())
		default:
		}
		if time.Now().After(deadline) {
			return b, fmt.Errorf("hutch serve did not answer GET /health within 30s")
		}
	}
}

func (b *bench) hutch(args ...string) (string, error) {
	cmd := exec.Command(filepath.Join(b.bin, "hutch"), args...)
	cmd.Env = b.env
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("hutch %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return string(out), nil
}

// createAndRun times POST /sandboxes of the template through the Go
// client, then POST /execute of '1+1' to its result.
func (b *bench) createAndRun(ctx context.Context) (*client.Sandbox, time.Duration, error) {
	t0 := time.Now()
	sb, err := b.c.Create(ctx, client.CreateRequest{TemplateID: template, Timeout: 600})
	if err != nil {
		return nil, 0, fmt.Errorf("create: %w", err)
	}
	x, err := sb.Code().Execute(ctx, client.CodeRequest{Code: "1+1"}, nil)
	d := time.Since(t0)
	if err != nil {
		return sb, 0, fmt.Errorf("runCode('1+1') in %s: %w", sb.ID, err)
	}
	if x.Text() != "2" {
		return sb, 0, fmt.Errorf("runCode('1+1') in %s gave %+v", sb.ID, x)
	}
	return sb, d, nil
}

type poolInfo struct {
	Ready   int      `json:"ready"`
	Size    int      `json:"size"`
	Members []string `json:"members"`
	Error   string   `json:"error"`
}

// waitPool waits until the pool has n sandboxes ready and returns them.
func (b *bench) waitPool(n int, limit time.Duration) ([]string, error) {
	var last []poolInfo
	for deadline := time.Now().Add(limit); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		out, err := b.hutch("pool", "ls", "--format", "json")
		if err != nil {
			return nil, err
		}
		if json.Unmarshal([]byte(out), &last) == nil && len(last) == 1 && last[0].Ready >= n {
			return last[0].Members, nil
		}
	}
	return nil, fmt.Errorf("the pool did not fill within %s: %+v", limit, last)
}

type concResult struct {
	sandboxes, clients, calls int
	bytes                     int64
	wall                      time.Duration
	lat                       []float64
}

// concurrent runs clients clients across sandboxes sandboxes, each
// making calls executions that print a line unique to the client and
// call, and checks every byte each one gets back.
func (b *bench) concurrent(ctx context.Context, sandboxes, clients, calls int) (concResult, error) {
	r := concResult{sandboxes: sandboxes, clients: clients, calls: calls}
	sbs := make([]*client.Sandbox, sandboxes)
	for i := range sbs {
		sb, _, err := b.createAndRun(ctx)
		if err != nil {
			return r, err
		}
		sbs[i] = sb
	}
	defer func() {
		for _, sb := range sbs {
			b.c.Kill(ctx, sb.ID) //nolint:errcheck // best effort
		}
	}()
	// Each client has its own context in its sandbox, as separate users
	// of one sandbox would.
	ctxs := make([]string, clients)
	for i := range ctxs {
		cc, err := sbs[i%sandboxes].Code().CreateContext(ctx, "python", "")
		if err != nil {
			return r, err
		}
		ctxs[i] = cc.ID
	}
	var mu sync.Mutex
	var wg sync.WaitGroup
	errs := make(chan error, clients)
	t0 := time.Now()
	for i := 0; i < clients; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			code := sbs[i%sandboxes].Code()
			for k := 0; k < calls; k++ {
				want := fmt.Sprintf("client %d call %d %s\n", i, k, strings.Repeat("x", 200+k))
				s := time.Now()
				x, err := code.Execute(ctx, client.CodeRequest{ContextID: ctxs[i], Code: fmt.Sprintf("print(%q, end='')", want)}, nil)
				d := time.Since(s)
				if err != nil {
					errs <- fmt.Errorf("client %d call %d: %w", i, k, err)
					return
				}
				if got := strings.Join(x.Stdout, ""); got != want || x.Error != nil {
					errs <- fmt.Errorf("client %d call %d: got %q (error %v), want %q", i, k, got, x.Error, want)
					return
				}
				mu.Lock()
				r.lat = append(r.lat, d.Seconds())
				r.bytes += int64(len(want))
				mu.Unlock()
			}
		}(i)
	}
	wg.Wait()
	r.wall = time.Since(t0)
	close(errs)
	for err := range errs {
		return r, err
	}
	return r, nil
}

func (b *bench) cleanup() {
	if b.tmp == "" {
		b.stopServer()
		return
	}
	if out, err := b.hutch("ls", "-q"); err == nil {
		for _, id := range strings.Fields(out) {
			b.hutch("rm", "-f", id) //nolint:errcheck // best effort on the way out
		}
	}
	b.hutch("pool", "rm", "bench") //nolint:errcheck // best effort
	b.stopServer()
	if out, err := b.hutch("ls", "-q"); err == nil {
		for _, id := range strings.Fields(out) {
			b.hutch("rm", "-f", id) //nolint:errcheck // pool members
		}
	}
	os.RemoveAll(b.tmp)
	b.tmp = ""
}

func (b *bench) stopServer() {
	if b.srv != nil && b.srv.Process != nil && b.srv.ProcessState == nil {
		b.srv.Process.Signal(syscall.SIGTERM)
		select {
		case <-b.exited:
		case <-time.After(15 * time.Second):
			b.srv.Process.Kill()
			<-b.exited
		}
	}
}

type report struct {
	started      time.Time
	elapsed      time.Duration
	load0, load1 string
	restored     []float64
	pooled       []float64
	rt           []float64
	conc         concResult
	createN      int
}

func quantile(v []float64, q float64) float64 {
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	i := int(math.Ceil(q*float64(len(s)))) - 1
	return s[max(i, 0)]
}

func ms(s float64) string {
	v := s * 1000
	if v < 10 {
		return fmt.Sprintf("%.2f ms", v)
	}
	return fmt.Sprintf("%.0f ms", v)
}

func render(r report) string {
	var w strings.Builder
	p := func(format string, a ...any) { fmt.Fprintf(&w, format, a...) }
	p("## The code interpreter through `hutch serve`\n\n")
	p("Produced by `make bench` (integration/bench/codeinterp) on %s, as root, in %s. Machine: %d CPUs, %s. "+
		"Load average (1 min) at start %s, at end %s. The machine is shared: compare rows of one run, not runs.\n\n",
		r.started.UTC().Format("2006-01-02 15:04 UTC"), r.elapsed.Round(time.Second), runtime.NumCPU(), runtime.GOOS+"/"+runtime.GOARCH, r.load0, r.load1)
	p("The server (`hutch serve`, plain HTTP on 127.0.0.1) and the clients run on the same machine; the clients are the Go client " +
		"(`hutch.dev/hutch/client`), which speaks the protocol of E2B's code-interpreter SDK: `POST /sandboxes` of template " +
		"`code-interpreter-v1`, then `POST /execute` through the server's port routing to port 49999, read to `end_of_execution`.\n\n")
	p("### Create → first `runCode('1+1')` result\n\n")
	p("| create | p50 | p90 | min | runs |\n|---|---:|---:|---:|---:|\n")
	for _, row := range []struct {
		name string
		v    []float64
	}{{"restored from the template's checkpoint (no pool)", r.restored}, {"claimed from a pool of the template (size 2, refilled between runs)", r.pooled}} {
		p("| %s | %s | %s | %s | %d |\n", row.name, ms(quantile(row.v, 0.5)), ms(quantile(row.v, 0.9)), ms(quantile(row.v, 0)), len(row.v))
	}
	p("\nBoth kinds of sandbox are restored with the server and its default Python and JavaScript kernels running: " +
		"the first call is answered by a kernel that was already up.\n\n")
	p("### `runCode('1+1')` round trip on a warm context\n\n")
	p("One sandbox, its default Python context, one call at a time over a kept-alive connection, after 20 untimed calls.\n\n")
	p("| p50 | p90 | p99 | min | runs |\n|---:|---:|---:|---:|---:|\n| %s | %s | %s | %s | %d |\n\n",
		ms(quantile(r.rt, 0.5)), ms(quantile(r.rt, 0.9)), ms(quantile(r.rt, 0.99)), ms(quantile(r.rt, 0)), len(r.rt))
	c := r.conc
	p("### %d concurrent clients across %d sandboxes\n\n", c.clients, c.sandboxes)
	p("Each client has a Python context of its own (%d per sandbox) and makes %d calls one after another, each printing a line "+
		"unique to the client and call (200 to %d bytes); every byte that comes back is compared with what was printed. "+
		"All %d calls passed the check: %d bytes.\n\n", c.clients/c.sandboxes, c.calls, 200+c.calls+30, c.clients*c.calls, c.bytes)
	p("| wall time | calls/s | p50 | p90 | p99 |\n|---:|---:|---:|---:|---:|\n| %s | %.0f | %s | %s | %s |\n\n",
		c.wall.Round(time.Millisecond), float64(len(c.lat))/c.wall.Seconds(), ms(quantile(c.lat, 0.5)), ms(quantile(c.lat, 0.9)), ms(quantile(c.lat, 0.99)))
	p("### Published figures, for comparison\n\n")
	p("Quoted as published, not measured here, on other machines and networks; no ratio is computed from them.\n\n")
	p("| source | what | figure |\n|---|---|---:|\n")
	p("| ComputeSDK sandbox benchmarks, 2026-04 | E2B: create → first command | 0.44 s |\n\n")
	return w.String()
}

func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	return strings.Fields(string(b))[0]
}
