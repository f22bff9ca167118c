// Command serve measures the round trip of a command through `hutch serve`
// (its E2B-compatible API, with the Go client and with the E2B JavaScript
// SDK) against `hutch exec` and raw `runsc exec` into the same sandbox, and
// create → first output through the API against `hutch run --rm`. It writes
// its own section of docs/benchmarks.md. Run it through `make bench` (as
// root).
package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	_ "embed"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"connectrpc.com/connect"

	"hutch.dev/hutch/client"
	"hutch.dev/hutch/integration/bench/benchdoc"
	"hutch.dev/hutch/integration/bench/benchexit"
	"hutch.dev/hutch/serve/envdpb/processpb"
)

//go:embed sdk.cjs
var sdkScript []byte

type config struct {
	bin, out, e2b  string
	n, createN     int
	warmup         int
	skipSDK        bool
	command        string
	started        time.Time
	nproc          int
	loadAvgAtStart string
}

func main() {
	var c config
	flag.StringVar(&c.bin, "bin", "bin", "directory holding hutch, hutch-init, runsc and images/busybox.tar")
	flag.StringVar(&c.out, "out", "", "markdown file whose serve section is (re)written; empty: stdout only")
	flag.StringVar(&c.e2b, "e2b", "integration/e2b", "directory whose node_modules hold the E2B JavaScript SDK (`make e2b-sdk`)")
	flag.IntVar(&c.n, "n", 200, "measured runs per side for the command round trips")
	flag.IntVar(&c.createN, "create-n", 20, "measured runs per side for create → first output")
	flag.IntVar(&c.warmup, "warmup", 5, "untimed runs per side before each benchmark")
	flag.BoolVar(&c.skipSDK, "no-sdk", false, "skip the rows that need the default image and the E2B SDK")
	flag.Parse()
	if flag.NArg() != 0 || c.n < 1 || c.createN < 1 || c.warmup < 0 {
		flag.Usage()
		os.Exit(2)
	}
	c.command = invocation()
	c.started = time.Now()
	c.nproc = runtime.NumCPU()
	c.loadAvgAtStart = loadAverage()
	var err error
	if c.bin, err = filepath.Abs(c.bin); err != nil {
		benchexit.Fatal(err)
	}
	if c.e2b, err = filepath.Abs(c.e2b); err != nil {
		benchexit.Fatal(err)
	}
	b, err := start(c)
	if err != nil {
		benchexit.Fatal(err)
	}
	benchexit.AtExit(b.cleanup)
	rep, err := b.measure()
	b.cleanup()
	if err != nil {
		benchexit.Fatal(err)
	}
	section := render(rep)
	fmt.Print(section)
	if c.out == "" {
		return
	}
	if err := benchdoc.WriteSection(c.out, "serve", section); err != nil {
		benchexit.Fatal(err)
	}
	fmt.Fprintf(os.Stderr, "bench: wrote %s\n", c.out)
}

// bench is one run: a fresh state root, a server on it, and the sandboxes
// the commands run in.
type bench struct {
	cfg    config
	tmp    string
	root   string
	env    []string // of every hutch command: HUTCH_ROOT, no other HUTCH_*
	srv    *exec.Cmd
	exited chan struct{}
	addr   string
	c      *client.Client
	// The same over TLS: HTTPS with HTTP/2, on the same state root.
	tlsSrv    *exec.Cmd
	tlsExited chan struct{}
	tlsAddr   string
	tlsC      *client.Client
	// tlsVersion is the TLS version the client and server negotiated.
	tlsVersion string
	busybox    *client.Sandbox
	globals    []string // runsc global flags of the busybox sandbox
	base       *client.Sandbox
	node       *nodeSDK
	done       bool
}

func progress(format string, a ...any) {
	fmt.Fprintf(os.Stderr, "bench: "+format+"\n", a...)
}

func start(c config) (*bench, error) {
	for _, f := range []string{"hutch", "hutch-init", "runsc", "images/busybox.tar"} {
		if _, err := os.Stat(filepath.Join(c.bin, f)); err != nil {
			return nil, fmt.Errorf("%w (run `make build`)", err)
		}
	}
	tmp, err := os.MkdirTemp("", "hutch-bench-serve-")
	if err != nil {
		return nil, err
	}
	b := &bench{cfg: c, tmp: tmp, root: filepath.Join(tmp, "hutch")}
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "HUTCH_") {
			b.env = append(b.env, kv)
		}
	}
	b.env = append(b.env, "HUTCH_ROOT="+b.root)
	tenants := filepath.Join(tmp, "tenants")
	key, err := b.hutch("tenant", "add", "--tenants", tenants, "bench")
	if err != nil {
		return b, err
	}
	// Two servers on the one state root, which share its key and so the
	// sandboxes' tokens: plain HTTP/1.1, and HTTPS with HTTP/2 (the
	// development CA, for localhost).
	if b.addr, b.srv, b.exited, err = b.serve("plain", "--tenants", tenants, "--audit-log", "-"); err != nil {
		return b, err
	}
	if b.tlsAddr, b.tlsSrv, b.tlsExited, err = b.serve("tls", "--tenants", tenants, "--audit-log", "-", "--tls-self-signed"); err != nil {
		return b, err
	}
	url := "http://" + b.addr
	b.c = &client.Client{APIURL: url, APIKey: strings.TrimSpace(key)}
	ca, err := os.ReadFile(filepath.Join(b.root, "serve", "tls", "ca.pem"))
	if err != nil {
		return b, err
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(ca)
	b.tlsC = &client.Client{APIURL: "https://localhost:" + strings.Split(b.tlsAddr, ":")[1], APIKey: b.c.APIKey, HTTP: &http.Client{
		Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots}, ForceAttemptHTTP2: true},
	}}
	resp, err := b.tlsC.HTTP.Get(b.tlsC.APIURL + "/health")
	if err != nil {
		return b, err
	}
	resp.Body.Close()
	if resp.Proto != "HTTP/2.0" {
		return b, fmt.Errorf("the TLS server answered over %s, not HTTP/2", resp.Proto)
	}
	b.tlsVersion = tls.VersionName(resp.TLS.Version)
	return b, nil
}

// serve starts a hutch serve on a free loopback port with args, and
// waits until it answers GET /health.
func (b *bench) serve(name string, args ...string) (string, *exec.Cmd, chan struct{}, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, nil, err
	}
	addr := l.Addr().String()
	l.Close()
	logf, err := os.Create(filepath.Join(b.tmp, "serve-"+name+".log"))
	if err != nil {
		return "", nil, nil, err
	}
	defer logf.Close()
	srv := exec.Command(filepath.Join(b.cfg.bin, "hutch"), append([]string{"serve", "--listen", addr}, args...)...)
	srv.Env = b.env
	srv.Stdout, srv.Stderr = logf, logf
	if err := srv.Start(); err != nil {
		return "", nil, nil, err
	}
	exited := make(chan struct{})
	go func() { srv.Wait(); close(exited) }() //nolint:errcheck // its status is in ProcessState
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	scheme := "http://"
	if slices.Contains(args, "--tls-self-signed") {
		scheme = "https://"
	}
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if resp, err := hc.Get(scheme + addr + "/health"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return addr, srv, exited, nil
			}
		}
		select {
		case <-exited:
			return "", nil, nil, fmt.Errorf("hutch serve exited: %v (log: %s)", srv.ProcessState, logf.Name())
		default:
		}
		if time.Now().After(deadline) {
			srv.Process.Kill()
			<-exited
			return "", nil, nil, fmt.Errorf("hutch serve (%s) did not answer GET /health within 30s", name)
		}
	}
}

// hutch runs hutch on the run's state root and returns its stdout.
func (b *bench) hutch(args ...string) (string, error) {
	cmd := exec.Command(filepath.Join(b.cfg.bin, "hutch"), args...)
	cmd.Env = b.env
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("hutch %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return string(out), nil
}

// cleanup removes every sandbox of the run, stops the server and any
// builder hutch started, and removes the state root.
func (b *bench) cleanup() {
	if b.done {
		return
	}
	b.done = true
	if b.node != nil {
		b.node.close()
	}
	if out, err := b.hutch("ls", "-q"); err == nil {
		for _, id := range strings.Fields(out) {
			b.hutch("rm", "-f", id) //nolint:errcheck // best effort on the way out
		}
	}
	for _, srv := range []struct {
		cmd    *exec.Cmd
		exited chan struct{}
	}{{b.srv, b.exited}, {b.tlsSrv, b.tlsExited}} {
		if srv.cmd == nil || srv.cmd.Process == nil {
			continue
		}
		srv.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-srv.exited:
		case <-time.After(15 * time.Second):
			srv.cmd.Process.Kill()
			<-srv.exited
		}
	}
	if pb, err := os.ReadFile(filepath.Join(b.root, "buildkit", "supervisor.pid")); err == nil {
		if pid, _ := strconv.Atoi(strings.TrimSpace(string(pb))); pid > 0 {
			syscall.Kill(pid, syscall.SIGTERM)
			for i := 0; i < 300 && syscall.Kill(pid, 0) == nil; i++ {
				time.Sleep(100 * time.Millisecond)
			}
		}
	}
	os.RemoveAll(b.tmp)
}

// side is one way of running a command, timed by run.
type side struct {
	name string
	run  func() (time.Duration, error)
	got  []float64 // seconds
}

// interleave runs warm-up calls of every side, then n rounds in which each
// side runs once, the order rotating from round to round.
func interleave(what string, n, warmup int, sides []*side) error {
	progress("%s: %d warm-up and %d measured runs per side, interleaved", what, warmup, n)
	for i := 0; i < warmup; i++ {
		for _, s := range sides {
			if _, err := s.run(); err != nil {
				return fmt.Errorf("%s, warm-up: %w", s.name, err)
			}
		}
	}
	for i := 0; i < n; i++ {
		for k := range sides {
			s := sides[(i+k)%len(sides)]
			d, err := s.run()
			if err != nil {
				return fmt.Errorf("%s, run %d: %w", s.name, i, err)
			}
			s.got = append(s.got, d.Seconds())
		}
	}
	return nil
}

// report is what one run measured.
type report struct {
	cfg          config
	elapsed      time.Duration
	loadAvgEnd   string
	runscVersion string
	exec         []*side
	sdk          []*side
	sdkSkipped   string
	create       []*side
}

func (b *bench) measure() (*report, error) {
	rep := &report{cfg: b.cfg}
	ctx := context.Background()
	if v, err := exec.Command(filepath.Join(b.cfg.bin, "runsc"), "--version").Output(); err == nil {
		rep.runscVersion = strings.SplitN(strings.TrimSpace(string(v)), "\n", 2)[0]
	}

	var err error
	if b.busybox, err = b.c.Create(ctx, client.CreateRequest{TemplateID: "busybox", Timeout: 3600}); err != nil {
		return nil, fmt.Errorf("create the busybox sandbox: %w", err)
	}
	out, err := b.hutch("inspect", "--format", "debug", b.busybox.ID)
	if err != nil {
		return nil, err
	}
	var rec struct {
		Pid int `json:"pid"`
	}
	if err := json.Unmarshal([]byte(out), &rec); err != nil {
		return nil, fmt.Errorf("hutch inspect %s: %w", b.busybox.ID, err)
	}
	if b.globals, err = runscGlobals(rec.Pid); err != nil {
		return nil, err
	}

	id := b.busybox.ID
	overTLS, err := b.tlsC.Connect(ctx, id, time.Hour)
	if err != nil {
		return nil, fmt.Errorf("connect to the busybox sandbox over TLS: %w", err)
	}
	rep.exec = []*side{
		{name: "API, Go client", run: func() (time.Duration, error) { return b.apiEcho(ctx, b.busybox) }},
		{name: "API, Go client, HTTPS (" + b.tlsVersion + ", HTTP/2)", run: func() (time.Duration, error) { return b.apiEcho(ctx, overTLS) }},
		{name: "`hutch exec ID -- /bin/echo hi`", run: func() (time.Duration, error) {
			return timeCmd(b.env, filepath.Join(b.cfg.bin, "hutch"), "exec", id, "--", "/bin/echo", "hi")
		}},
		{name: "`runsc exec ID /bin/echo hi`", run: func() (time.Duration, error) {
			args := append(append(append([]string{}, b.globals...), "exec", id), "/bin/echo", "hi")
			return timeCmd(b.env, filepath.Join(b.cfg.bin, "runsc"), args...)
		}},
	}
	if err := interleave("echo hi → exit, busybox", b.cfg.n, b.cfg.warmup, rep.exec); err != nil {
		return nil, err
	}

	if reason := b.sdkUnavailable(); reason != "" {
		rep.sdkSkipped = reason
		progress("SDK rows skipped: %s", reason)
	} else {
		progress("creating a sandbox of the default image (built on first use)")
		if b.base, err = b.c.Create(ctx, client.CreateRequest{TemplateID: "base", Timeout: 3600}); err != nil {
			return nil, fmt.Errorf("create the base sandbox: %w", err)
		}
		if b.node, err = startNodeSDK(b, b.base.ID, "echo hi", "hi\n"); err != nil {
			return nil, err
		}
		rep.sdk = []*side{
			{name: "API, Go client `Sandbox.Run`", run: func() (time.Duration, error) {
				t0 := time.Now()
				res, err := b.base.Run(ctx, client.RunRequest{Cmd: "echo hi"})
				d := time.Since(t0)
				if err == nil && (res.ExitCode != 0 || res.Stdout != "hi\n") {
					err = fmt.Errorf("exit %d, stdout %q", res.ExitCode, res.Stdout)
				}
				return d, err
			}},
			{name: "API, E2B JS SDK `sandbox.commands.run`", run: b.node.run},
		}
		if err := interleave("bash -l -c 'echo hi' → exit, base", b.cfg.n, b.cfg.warmup, rep.sdk); err != nil {
			return nil, err
		}
	}

	rep.create = []*side{
		{name: "API: create (busybox), then start `/bin/echo hi`", run: func() (time.Duration, error) { return b.apiCreateEcho(ctx) }},
		{name: "`hutch run --rm --image busybox -- /bin/echo hi`", run: func() (time.Duration, error) {
			return firstByte(b.env, filepath.Join(b.cfg.bin, "hutch"), "run", "--rm", "--image", "busybox", "--", "/bin/echo", "hi")
		}},
	}
	warm := min(b.cfg.warmup, 2)
	if err := interleave("create → first output", b.cfg.createN, warm, rep.create); err != nil {
		return nil, err
	}
	rep.elapsed = time.Since(b.cfg.started)
	rep.loadAvgEnd = loadAverage()
	return rep, nil
}

// start starts /bin/echo hi as root in sb through the API's process
// service and returns its stream.
func startEcho(ctx context.Context, sb *client.Sandbox) (*connect.ServerStreamForClient[processpb.StartResponse], error) {
	no := false
	return sb.Process("root").Start(ctx, connect.NewRequest(&processpb.StartRequest{
		Process: &processpb.ProcessConfig{Cmd: "/bin/echo", Args: []string{"hi"}},
		Stdin:   &no,
	}))
}

// apiEcho times /bin/echo hi through the API, from the request to the
// end event, and checks its output.
func (b *bench) apiEcho(ctx context.Context, sb *client.Sandbox) (time.Duration, error) {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	t0 := time.Now()
	stream, err := startEcho(ctx, sb)
	if err != nil {
		return 0, err
	}
	defer stream.Close()
	var out []byte
	for stream.Receive() {
		ev := stream.Msg().GetEvent()
		out = append(out, ev.GetData().GetStdout()...)
		if e := ev.GetEnd(); e != nil {
			d := time.Since(t0)
			if e.GetExitCode() != 0 || string(out) != "hi\n" {
				return d, fmt.Errorf("exit %d, stdout %q", e.GetExitCode(), out)
			}
			return d, nil
		}
	}
	return 0, fmt.Errorf("stream ended without an end event: %v", stream.Err())
}

// apiCreateEcho times a create through the API and a start of
// /bin/echo hi in the new sandbox, to the first byte of its output; the
// sandbox is killed after the clock stops.
func (b *bench) apiCreateEcho(ctx context.Context) (time.Duration, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	t0 := time.Now()
	sb, err := b.c.Create(ctx, client.CreateRequest{TemplateID: "busybox", Timeout: 600})
	if err != nil {
		return 0, err
	}
	defer b.c.Kill(context.Background(), sb.ID) //nolint:errcheck // checked by the clean-up's hutch ls
	stream, err := startEcho(ctx, sb)
	if err != nil {
		return 0, err
	}
	defer stream.Close()
	for stream.Receive() {
		if out := stream.Msg().GetEvent().GetData().GetStdout(); len(out) > 0 {
			d := time.Since(t0)
			if out[0] != 'h' {
				return d, fmt.Errorf("first output %q, want hi", out)
			}
			return d, nil
		}
	}
	return 0, fmt.Errorf("stream ended before any output: %v", stream.Err())
}

// timeCmd times a command from fork to exit and checks that it printed hi.
func timeCmd(env []string, name string, args ...string) (time.Duration, error) {
	cmd := exec.Command(name, args...)
	cmd.Env = env
	var out, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &stderr
	t0 := time.Now()
	err := cmd.Run()
	d := time.Since(t0)
	if err != nil {
		return d, fmt.Errorf("%s: %w: %s", filepath.Base(name), err, strings.TrimSpace(stderr.String()))
	}
	if out.String() != "hi\n" {
		return d, fmt.Errorf("%s printed %q, want hi", filepath.Base(name), out.String())
	}
	return d, nil
}

// firstByte times a command from fork to the first byte of its stdout,
// then waits for it (untimed).
func firstByte(env []string, name string, args ...string) (time.Duration, error) {
	cmd := exec.Command(name, args...)
	cmd.Env = env
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return 0, err
	}
	t0 := time.Now()
	if err := cmd.Start(); err != nil {
		return 0, err
	}
	buf := make([]byte, 1)
	_, rerr := io.ReadFull(stdout, buf)
	d := time.Since(t0)
	io.Copy(io.Discard, stdout)
	if err := cmd.Wait(); err != nil {
		return d, fmt.Errorf("%s: %w: %s", filepath.Base(name), err, strings.TrimSpace(stderr.String()))
	}
	if rerr != nil || buf[0] != 'h' {
		return d, fmt.Errorf("%s: first output %q (%v), want hi", filepath.Base(name), buf, rerr)
	}
	return d, nil
}

// runscGlobals reads the global flags that the gVisor sandbox process pid
// was started with: its arguments before the "boot" subcommand.
func runscGlobals(pid int) ([]string, error) {
	cl, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	if err != nil {
		return nil, err
	}
	args := strings.Split(strings.TrimRight(string(cl), "\x00"), "\x00")
	for i, a := range args {
		if a == "boot" {
			return args[1:i], nil
		}
	}
	return nil, fmt.Errorf("process %d is not a runsc sandbox: %q", pid, args)
}

// sdkUnavailable says why the SDK rows cannot run, or "".
func (b *bench) sdkUnavailable() string {
	if b.cfg.skipSDK {
		return "-no-sdk was given"
	}
	if _, err := exec.LookPath("node"); err != nil {
		return "node is not installed"
	}
	if _, err := os.Stat(filepath.Join(b.cfg.e2b, "node_modules", "e2b", "package.json")); err != nil {
		return "the E2B SDK is not installed in " + b.cfg.e2b + " (`make e2b-sdk`)"
	}
	return ""
}

// nodeSDK is one node process that runs commands through the E2B SDK,
// one for each line it is sent, and prints each round trip.
type nodeSDK struct {
	cmd   *exec.Cmd
	in    io.WriteCloser
	lines *bufio.Scanner
}

func startNodeSDK(b *bench, sandboxID, cmdline, want string) (*nodeSDK, error) {
	script := filepath.Join(b.tmp, "sdk.cjs")
	if err := os.WriteFile(script, sdkScript, 0o644); err != nil {
		return nil, err
	}
	cmd := exec.Command("node", script)
	cmd.Env = append(append([]string{}, b.env...),
		"E2B_API_URL=http://"+b.addr, "E2B_SANDBOX_URL=http://"+b.addr,
		"E2B_API_KEY="+b.c.APIKey, "E2B_DOMAIN=localhost",
		"E2B_SDK_DIR="+filepath.Join(b.cfg.e2b, "node_modules"),
		"SANDBOX_ID="+sandboxID, "CMD="+cmdline, "WANT="+want)
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	n := &nodeSDK{cmd: cmd, in: in, lines: bufio.NewScanner(out)}
	if line, err := n.line(); err != nil || line != "ready" {
		n.close()
		return nil, fmt.Errorf("the node SDK driver: %q %v", line, err)
	}
	return n, nil
}

func (n *nodeSDK) line() (string, error) {
	if !n.lines.Scan() {
		if err := n.lines.Err(); err != nil {
			return "", err
		}
		return "", io.EOF
	}
	return n.lines.Text(), nil
}

func (n *nodeSDK) run() (time.Duration, error) {
	if _, err := io.WriteString(n.in, "run\n"); err != nil {
		return 0, err
	}
	line, err := n.line()
	if err != nil {
		return 0, fmt.Errorf("the node SDK driver ended: %w", err)
	}
	ms, err := strconv.ParseFloat(line, 64)
	if err != nil {
		return 0, fmt.Errorf("the node SDK driver: %s", line)
	}
	return time.Duration(ms * float64(time.Millisecond)), nil
}

func (n *nodeSDK) close() {
	n.in.Close()
	done := make(chan struct{})
	go func() { n.cmd.Wait(); close(done) }() //nolint:errcheck // on the way out
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		n.cmd.Process.Kill()
		<-done
	}
}

// quantile by nearest rank of sorted samples.
func quantile(sorted []float64, q float64) float64 {
	i := int(math.Ceil(q*float64(len(sorted)))) - 1
	return sorted[max(i, 0)]
}

func ms(s float64) string {
	v := s * 1000
	if v < 10 {
		return fmt.Sprintf("%.2f ms", v)
	}
	return fmt.Sprintf("%.1f ms", v)
}

func table(w *strings.Builder, sides []*side) {
	fmt.Fprintf(w, "| path | p50 | p99 | min | runs |\n|---|---:|---:|---:|---:|\n")
	for _, s := range sides {
		v := append([]float64(nil), s.got...)
		sort.Float64s(v)
		fmt.Fprintf(w, "| %s | %s | %s | %s | %d |\n", s.name, ms(quantile(v, 0.5)), ms(quantile(v, 0.99)), ms(v[0]), len(v))
	}
	fmt.Fprintf(w, "\n")
}

func median(s *side) float64 {
	v := append([]float64(nil), s.got...)
	sort.Float64s(v)
	return quantile(v, 0.5)
}

func render(r *report) string {
	var w strings.Builder
	p := func(format string, a ...any) { fmt.Fprintf(&w, format, a...) }
	p("## `hutch serve`: a command through the API\n\n")
	p("Produced by %s on %s, as root, in %s. Machine: %d CPUs, %s; %s. Load average (1 min) at start %s, at end %s. "+
		"The machine is shared: compare rows of one run, not runs.\n\n",
		r.cfg.command, r.cfg.started.UTC().Format("2006-01-02 15:04 UTC"), r.elapsed.Round(time.Second),
		r.cfg.nproc, runtime.GOOS+"/"+runtime.GOARCH, r.runscVersion, r.cfg.loadAvgAtStart, r.loadAvgEnd)
	p("The server (`hutch serve`, one tenant, on 127.0.0.1) and every client run on the same machine. "+
		"Each table's rows run interleaved (the order rotating each round) after %d untimed warm-up runs each; "+
		"p99 is by nearest rank.\n\n", r.cfg.warmup)

	p("### `echo hi` → exit, into one running sandbox\n\n")
	p("All four run `/bin/echo hi` directly (no shell) as a new process in the same busybox sandbox, " +
		"which the API created, and check its output. " +
		"*API*: the Go client (`hutch.dev/hutch/client`) calls the envd process service's `Start` over the kept-alive " +
		"HTTP connection and reads the stream to the end event. " +
		"*HTTPS*: the same, through a second `hutch serve --tls-self-signed` on the same state root (so the same sandbox), " +
		"over one kept-alive TLS connection speaking HTTP/2 (its version in the row), which the first call's handshake opened. " +
		"*`hutch exec`*: the CLI, from fork to exit (it makes runsc's exec calls on the sandbox's control socket itself). " +
		"*`runsc exec`*: runsc with the sandbox's own global flags, from fork to exit.\n\n")
	table(&w, r.exec)
	api, tls, cli, raw := median(r.exec[0]), median(r.exec[1]), median(r.exec[2]), median(r.exec[3])
	p("Difference of medians: API − `hutch exec` %s, API − `runsc exec` %s. "+
		"Over HTTPS the API's median is %.2fx that of plain HTTP/1.1 (%s).\n\n",
		signed(api-cli), signed(api-raw), tls/api, signed(tls-api))

	p("### A command as the E2B SDKs run it, `bash -l -c 'echo hi'`\n\n")
	if r.sdkSkipped != "" {
		p("Not measured in this run: %s.\n\n", r.sdkSkipped)
	} else {
		p("In a sandbox of the default image (Debian; the SDK runs every command with `/bin/bash -l -c`), as user `user`. " +
			"*Go client*: `Sandbox.Run`. *E2B JS SDK*: `sandbox.commands.run('echo hi')` of e2b (the version pinned in integration/e2b), " +
			"one `Sandbox.connect` then one call at a time, timed inside node. Both check the output.\n\n")
		table(&w, r.sdk)
	}

	p("### Create → first output\n\n")
	p("*API*: `POST /sandboxes` (template busybox) through the Go client, then the process service's `Start` of `/bin/echo hi`, "+
		"to the first byte of its output; the sandbox is killed after the clock stops. "+
		"*`hutch run --rm`*: from fork to the first byte on its stdout pipe, in the same state root. %d runs per side, %d warm-up.\n\n",
		r.cfg.createN, min(r.cfg.warmup, 2))
	table(&w, r.create)
	return w.String()
}

func signed(s float64) string {
	if s >= 0 {
		return "+" + ms(s)
	}
	return "−" + ms(-s)
}

func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	return strings.Fields(string(b))[0]
}

// invocation is the command line of this run as the report shows it:
// `make bench` when only the flags that the Makefile passes were given.
func invocation() string {
	args := []string{"go", "run", "./integration/bench/serve"}
	makeFlags := true
	flag.Visit(func(f *flag.Flag) {
		v := f.Value.String()
		switch f.Name {
		case "bin":
			if wd, err := os.Getwd(); err == nil {
				if rel, err := filepath.Rel(wd, v); err == nil && !strings.HasPrefix(rel, "..") {
					v = rel
				}
			}
		case "out":
		default:
			makeFlags = false
		}
		args = append(args, "-"+f.Name, v)
	})
	if makeFlags {
		return "`make bench` (`" + strings.Join(args, " ") + "`)"
	}
	return "`" + strings.Join(args, " ") + "`"
}
