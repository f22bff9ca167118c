// Command ssh measures the round trip of a command over SSH into a
// sandbox (`hutch ssh`, and OpenSSH's ssh with the Host block of
// `hutch ssh-config`, on a new connection and on a kept one) against
// `hutch exec` and raw `runsc exec` into the same sandbox, and writes its
// own section of docs/benchmarks.md. Run it through `make bench` (as
// root).
package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"time"

	"hutch.dev/hutch/integration/bench/benchdoc"
	"hutch.dev/hutch/integration/bench/benchexit"
)

type config struct {
	bin, out  string
	n, warmup int
}

// side is one way of running the command, and its measured round trips
// in seconds.
type side struct {
	name string
	run  func() (time.Duration, error)
	got  []float64
}

func main() {
	var c config
	flag.StringVar(&c.bin, "bin", "bin", "directory holding hutch, hutch-init, runsc and images/busybox.tar")
	flag.StringVar(&c.out, "out", "", "markdown file whose ssh section is (re)written; empty: stdout only")
	flag.IntVar(&c.n, "n", 100, "measured runs per side")
	flag.IntVar(&c.warmup, "warmup", 5, "untimed runs per side first")
	flag.Parse()
	if flag.NArg() != 0 || c.n < 1 || c.warmup < 0 {
		flag.Usage()
		os.Exit(2)
	}
	command := invocation()
	started := time.Now()
	loadStart := loadAverage()
	var err error
	if c.bin, err = filepath.Abs(c.bin); err != nil {
		benchexit.Fatal(err)
	}
	for _, tool := range []string{"ssh", "ssh-keygen"} {
		if _, err := exec.LookPath(tool); err != nil {
			benchexit.Fatalf("%s: %v (scripts/install-deps.sh installs openssh-client)", tool, err)
		}
	}
	tmp, err := os.MkdirTemp("", "hutch-bench-ssh-")
	if err != nil {
		benchexit.Fatal(err)
	}
	root := filepath.Join(tmp, "hutch")
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "HUTCH_") {
			env = append(env, kv)
		}
	}
	env = append(env, "HUTCH_ROOT="+root)
	hutch := func(args ...string) string {
		cmd := exec.Command(filepath.Join(c.bin, "hutch"), args...)
		cmd.Env = env
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			benchexit.Fatalf("hutch %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
		}
		return string(out)
	}
	var master *exec.Cmd
	cleanup := func() {
		if master != nil && master.Process != nil {
			master.Process.Kill()
			master.Wait() //nolint:errcheck // killed
		}
		cmd := exec.Command(filepath.Join(c.bin, "hutch"), "ls", "-q")
		cmd.Env = env
		out, _ := cmd.Output()
		for _, id := range strings.Fields(string(out)) {
			rm := exec.Command(filepath.Join(c.bin, "hutch"), "rm", "-f", id)
			rm.Env = env
			rm.Run() //nolint:errcheck // best effort on the way out
		}
		os.RemoveAll(tmp)
	}
	benchexit.AtExit(cleanup)

	id := strings.TrimSpace(hutch("create", "--image", "busybox", "--net", "none"))
	var rec struct {
		Pid int `json:"pid"`
	}
	// The host PID is in the engine's record only.
	if err := json.Unmarshal([]byte(hutch("inspect", "--format", "debug", id)), &rec); err != nil {
		benchexit.Fatalf("hutch inspect %s: %v", id, err)
	}
	globals, err := runscGlobals(rec.Pid)
	if err != nil {
		benchexit.Fatal(err)
	}
	key := filepath.Join(tmp, "id_ed25519")
	if out, err := exec.Command("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", key).CombinedOutput(); err != nil {
		benchexit.Fatalf("ssh-keygen: %v: %s", err, out)
	}
	conf := filepath.Join(tmp, "ssh_config")
	if err := os.WriteFile(conf, []byte(hutch("ssh-config", "--authorized-key", key+".pub", id)), 0o600); err != nil {
		benchexit.Fatal(err)
	}
	host := "hutch-" + id
	ctl := filepath.Join(tmp, "ctl")
	master = exec.Command("ssh", "-F", conf, "-o", "BatchMode=yes", "-o", "ControlMaster=yes", "-o", "ControlPath="+ctl, "-N", host)
	master.Env = env
	if err := master.Start(); err != nil {
		benchexit.Fatal(err)
	}
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if exec.Command("ssh", "-F", conf, "-o", "ControlPath="+ctl, "-O", "check", host).Run() == nil {
			break
		}
		if time.Now().After(deadline) {
			benchexit.Fatal("the kept ssh connection (ControlMaster) never came up")
		}
	}

	sides := []*side{
		{name: "`runsc exec ID /bin/echo hi`", run: func() (time.Duration, error) {
			args := append(append(append([]string{}, globals...), "exec", id), "/bin/echo", "hi")
			return timeCmd(env, filepath.Join(c.bin, "runsc"), args...)
		}},
		{name: "`hutch exec ID -- /bin/echo hi`", run: func() (time.Duration, error) {
			return timeCmd(env, filepath.Join(c.bin, "hutch"), "exec", id, "--", "/bin/echo", "hi")
		}},
		{name: "`hutch ssh ID -- /bin/echo hi`", run: func() (time.Duration, error) {
			return timeCmd(env, filepath.Join(c.bin, "hutch"), "ssh", "--authorized-key", key+".pub", id, "--", "/bin/echo", "hi")
		}},
		{name: "`ssh -F CONFIG hutch-ID /bin/echo hi`, a new connection", run: func() (time.Duration, error) {
			return timeCmd(env, "ssh", "-F", conf, "-o", "BatchMode=yes", host, "/bin/echo", "hi")
		}},
		{name: "`ssh -F CONFIG hutch-ID /bin/echo hi`, on a kept connection", run: func() (time.Duration, error) {
			return timeCmd(env, "ssh", "-F", conf, "-o", "BatchMode=yes", "-o", "ControlPath="+ctl, host, "/bin/echo", "hi")
		}},
	}
	if err := interleave(c.n, c.warmup, sides); err != nil {
		benchexit.Fatal(err)
	}
	elapsed := time.Since(started)
	runscVersion := "runsc ?"
	if v, err := exec.Command(filepath.Join(c.bin, "runsc"), "--version").Output(); err == nil {
		runscVersion = strings.SplitN(strings.TrimSpace(string(v)), "\n", 2)[0]
	}
	sshVersion := "OpenSSH ?"
	if v, err := exec.Command("ssh", "-V").CombinedOutput(); err == nil {
		sshVersion = strings.TrimSpace(string(v))
	}
	cleanup()

	var w strings.Builder
	p := func(format string, a ...any) { fmt.Fprintf(&w, format, a...) }
	p("## SSH: a command over `hutch ssh` and OpenSSH\n\n")
	p("Produced by %s on %s, as root, in %s. Machine: %d CPUs, %s; %s; %s. Load average (1 min) at start %s, at end %s. "+
		"The machine is shared: compare rows of one run, not runs.\n\n",
		command, started.UTC().Format("2006-01-02 15:04 UTC"), elapsed.Round(time.Second),
		runtime.NumCPU(), runtime.GOOS+"/"+runtime.GOARCH, runscVersion, sshVersion, loadStart, loadAverage())
	p("Every row runs `/bin/echo hi` as a new process in the same busybox sandbox (`--net none`) and checks its output, "+
		"from fork to exit; the rows run interleaved (the order rotating each round) after %d untimed warm-up runs each, p99 by nearest rank. "+
		"*`runsc exec`*: runsc with the sandbox's own global flags. "+
		"*`hutch exec`*: the CLI. "+
		"*`hutch ssh`*: the CLI writes the Host block to a temporary file and runs the system's `ssh` with it. "+
		"*`ssh -F CONFIG`*, a new connection: OpenSSH's client with the Host block `hutch ssh-config` printed; its ProxyCommand, `hutch ssh-proxy`, "+
		"starts the sandbox's agent as its SSH server with one exec, then the client does the key exchange and the user-key authentication "+
		"and runs the command over the session. "+
		"*On a kept connection*: the same client through an open `ControlMaster` connection, as an editor's remote session holds one, "+
		"so only the new channel and the command's process are paid.\n\n", c.warmup)
	p("| path | p50 | p99 | min | runs |\n|---|---:|---:|---:|---:|\n")
	for _, s := range sides {
		v := sorted(s)
		p("| %s | %s | %s | %s | %d |\n", s.name, ms(quantile(v, 0.5)), ms(quantile(v, 0.99)), ms(v[0]), len(v))
	}
	raw, cli, viaHutch, fresh, kept := median(sides[0]), median(sides[1]), median(sides[2]), median(sides[3]), median(sides[4])
	p("\nDifference of medians: `hutch ssh` − `hutch exec` %s; a new OpenSSH connection − `runsc exec` %s; a kept connection − `hutch exec` %s.\n",
		signed(viaHutch-cli), signed(fresh-raw), signed(kept-cli))
	section := w.String()
	fmt.Print(section)
	if c.out == "" {
		return
	}
	if err := benchdoc.WriteSection(c.out, "ssh", section); err != nil {
		benchexit.Fatal(err)
	}
	fmt.Fprintf(os.Stderr, "bench: wrote %s\n", c.out)
}

// interleave runs every side warmup times untimed, then n timed rounds,
// the order of the sides rotating each round.
func interleave(n, warmup int, sides []*side) error {
	for i := 0; i < warmup; i++ {
		for _, s := range sides {
			if _, err := s.run(); err != nil {
				return fmt.Errorf("%s (warm-up): %w", s.name, err)
			}
		}
	}
	for i := 0; i < n; i++ {
		for j := range sides {
			s := sides[(i+j)%len(sides)]
			d, err := s.run()
			if err != nil {
				return fmt.Errorf("%s: %w", s.name, err)
			}
			s.got = append(s.got, d.Seconds())
		}
		if (i+1)%20 == 0 {
			fmt.Fprintf(os.Stderr, "bench: %d/%d rounds\n", i+1, n)
		}
	}
	return nil
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

func sorted(s *side) []float64 {
	v := append([]float64(nil), s.got...)
	sort.Float64s(v)
	return v
}

func median(s *side) float64 { return quantile(sorted(s), 0.5) }

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
// `make bench` when it was given just the Makefile's flags (the
// checkout's bin and docs/benchmarks.md).
func invocation() string {
	args := []string{"go", "run", "./integration/bench/ssh"}
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
			makeFlags = makeFlags && v == "bin"
		case "out":
			makeFlags = makeFlags && filepath.Clean(v) == "docs/benchmarks.md"
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
