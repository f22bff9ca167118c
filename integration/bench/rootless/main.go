// Command rootless measures hutch run by an unprivileged user against hutch
// run by root and raw runsc, in one run, and writes the result as its own
// section of docs/benchmarks.md: create → first output, `run --rm`, exec
// latency and removal, with `--net none` and `--net open`, on the busybox
// image. Every pass takes the sides in turn, in an order that rotates
// from pass to pass, so that the machine's load falls on all alike.
//
// It runs as root: it creates the unprivileged user (hutchbench, with
// subordinate IDs) if missing, copies the binaries where that user can
// read them, and makes /dev/net/tun usable by every user for the run
// (slirp4netns needs it), putting its mode back at the end.
//
//	go run ./integration/bench/rootless -bin bin -out docs/benchmarks.md
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"os/user"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"

	"hutch.dev/hutch/integration/bench/benchdoc"
	"hutch.dev/hutch/integration/bench/benchexit"
)

// benchUser is the unprivileged user the rootless side runs as.
const benchUser = "hutchbench"

type config struct {
	bin, out       string
	n, execs, warm int
	phaseN         int
	command        string
}

func main() {
	asShim()
	var c config
	flag.StringVar(&c.bin, "bin", "bin", "directory holding hutch, hutch-init, runsc and images/busybox.tar")
	flag.StringVar(&c.out, "out", "", "markdown file whose rootless section is (re)written; empty: stdout only")
	flag.IntVar(&c.n, "n", 20, "measured passes (each side once per pass)")
	flag.IntVar(&c.execs, "execs", 5, "`exec true` runs per side per pass")
	flag.IntVar(&c.warm, "warmup", 1, "untimed passes first")
	flag.IntVar(&c.phaseN, "phase-n", 8, "passes of `hutch create` through the shims, per side and network mode")
	flag.Parse()
	if flag.NArg() != 0 || c.n < 1 || c.execs < 1 || c.warm < 0 || c.phaseN < 1 {
		flag.Usage()
		os.Exit(2)
	}
	c.command = invocation()
	if os.Geteuid() != 0 {
		benchexit.Fatal("rootless bench: run as root: it creates the unprivileged user and compares with root's hutch")
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	b, err := setup(ctx, c)
	if err != nil {
		if b != nil {
			b.cleanup()
		}
		benchexit.Fatalf("rootless bench: setup: %v", err)
	}
	benchexit.AtExit(b.cleanup)
	rep, err := b.measure(ctx)
	b.cleanup()
	if err != nil {
		benchexit.Fatalf("rootless bench: %v", err)
	}
	section := render(rep)
	fmt.Print(section)
	if c.out != "" {
		if err := benchdoc.WriteSection(c.out, "rootless", section); err != nil {
			benchexit.Fatal(err)
		}
		fmt.Fprintf(os.Stderr, "rootless bench: wrote %s\n", c.out)
	}
}

func progress(format string, a ...any) {
	fmt.Fprintf(os.Stderr, "rootless bench: "+format+"\n", a...)
}

// hutchSide is hutch run by one user.
type hutchSide struct {
	name string
	runner
	hutch string
	root  string // HUTCH_ROOT
	// shims: the directory, the log, and the environment that puts
	// the shims first in PATH.
	shimDir, shimLog string
	shimEnv          []string
}

func (s *hutchSide) cmd(ctx context.Context, args ...string) (string, error) {
	r, err := s.timed(ctx, s.hutch, args...)
	return strings.TrimSpace(r.out), err
}

// bench is one run's state.
type bench struct {
	cfg            config
	tmp, bin       string
	root, rootless *hutchSide
	raw            *rawSide
	uid, gid       int
	subIDs         string
	// tunMode is /dev/net/tun's mode before the run, if it was changed.
	tunMode    os.FileMode
	tunChanged bool
	// target is the root sandbox whose spec and runsc flags the raw
	// side copies; it lives for the whole run.
	target string
	done   bool
}

func setup(ctx context.Context, c config) (*bench, error) {
	src, err := filepath.Abs(c.bin)
	if err != nil {
		return nil, err
	}
	u, subIDs, err := benchAccount()
	if err != nil {
		return nil, err
	}
	tmp, err := os.MkdirTemp("", "hutch-rbench-")
	if err != nil {
		return nil, err
	}
	b := &bench{cfg: c, tmp: tmp, bin: filepath.Join(tmp, "bin"), subIDs: subIDs}
	b.uid, _ = strconv.Atoi(u.Uid)
	b.gid, _ = strconv.Atoi(u.Gid)
	if err := os.Chmod(tmp, 0o755); err != nil {
		return b, err
	}
	// The same binaries for every side, where the user can read them.
	for _, f := range []string{"hutch", "hutch-helper", "hutch-init", "runsc", "images/busybox.tar"} {
		if err := copyFile(filepath.Join(src, f), filepath.Join(b.bin, f), 0o755); err != nil {
			if f == "hutch-helper" && os.IsNotExist(err) {
				continue
			}
			return b, fmt.Errorf("%w (run `make build`)", err)
		}
	}
	if err := b.usableTun(); err != nil {
		return b, err
	}

	var clean []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "HUTCH_") && !strings.HasPrefix(kv, "XDG_") && !strings.HasPrefix(kv, "HOME=") &&
			!strings.HasPrefix(kv, "USER=") && !strings.HasPrefix(kv, "TMPDIR=") {
			clean = append(clean, kv)
		}
	}
	hutch := filepath.Join(b.bin, "hutch")
	runsc := filepath.Join(b.bin, "runsc")
	b.root = &hutchSide{name: "root", hutch: hutch, root: filepath.Join(tmp, "root")}
	b.root.env = append(append([]string{}, clean...), "HOME=/root", "USER=root", "HUTCH_ROOT="+b.root.root)
	b.root.dir = tmp
	data := filepath.Join(tmp, "data")
	if err := os.Mkdir(data, 0o700); err != nil {
		return b, err
	}
	if err := os.Chown(data, b.uid, b.gid); err != nil {
		return b, err
	}
	b.rootless = &hutchSide{name: "rootless", hutch: hutch, root: filepath.Join(data, "hutch")}
	b.rootless.env = append(append([]string{}, clean...), "HOME="+u.HomeDir, "USER="+u.Username,
		"XDG_DATA_HOME="+data, "TMPDIR="+data, "HUTCH_ROOT="+b.rootless.root)
	b.rootless.dir = tmp
	b.rootless.cred = &syscall.Credential{Uid: uint32(b.uid), Gid: uint32(b.gid), Groups: []uint32{}}
	for _, s := range []*hutchSide{b.root, b.rootless} {
		uid, gid := 0, 0
		if s.cred != nil {
			uid, gid = b.uid, b.gid
		}
		s.shimDir = filepath.Join(tmp, "shim-"+s.name)
		if s.shimLog, err = makeShims(s.shimDir, runsc, uid, gid); err != nil {
			return b, fmt.Errorf("shims: %w", err)
		}
		for _, kv := range s.env {
			if strings.HasPrefix(kv, "PATH=") {
				kv = "PATH=" + s.shimDir + ":" + strings.TrimPrefix(kv, "PATH=")
			}
			s.shimEnv = append(s.shimEnv, kv)
		}
	}

	// The raw side copies the spec and runsc flags of a root sandbox.
	progress("setting up in %s", tmp)
	if b.target, err = b.root.cmd(ctx, "create", "--image", "busybox", "--net", "none"); err != nil {
		return b, err
	}
	b.raw, err = newRawSide(ctx, b.root, b.target, runsc, filepath.Join(tmp, "raw"))
	return b, err
}

// benchAccount returns the unprivileged user, creating it (with
// subordinate IDs, as useradd gives a new user here) if missing.
func benchAccount() (*user.User, string, error) {
	u, err := user.Lookup(benchUser)
	if err != nil {
		if out, err := exec.Command("useradd", "--create-home", "--shell", "/bin/sh", benchUser).CombinedOutput(); err != nil {
			return nil, "", fmt.Errorf("useradd %s: %v: %s", benchUser, err, out)
		}
		if u, err = user.Lookup(benchUser); err != nil {
			return nil, "", err
		}
	}
	sub, err := subordinate("/etc/subuid", benchUser)
	if err != nil {
		return nil, "", err
	}
	if sub == "" {
		// useradd gave none (SUB_UID_* unset): the range after the
		// last one given.
		next, err := nextSubordinate()
		if err != nil {
			return nil, "", err
		}
		r := fmt.Sprintf("%d-%d", next, next+65535)
		if out, err := exec.Command("usermod", "--add-subuids", r, "--add-subgids", r, benchUser).CombinedOutput(); err != nil {
			return nil, "", fmt.Errorf("usermod %s: %v: %s", benchUser, err, out)
		}
		if sub, err = subordinate("/etc/subuid", benchUser); err != nil {
			return nil, "", err
		}
	}
	return u, sub, nil
}

// subordinate is name's range in an /etc/subuid-style file, "START:COUNT".
func subordinate(path, name string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil && !os.IsNotExist(err) {
		return "", err
	}
	for _, l := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(l, name+":"); ok {
			return rest, nil
		}
	}
	return "", nil
}

func nextSubordinate() (int, error) {
	next := 100000
	for _, p := range []string{"/etc/subuid", "/etc/subgid"} {
		b, err := os.ReadFile(p)
		if err != nil && !os.IsNotExist(err) {
			return 0, err
		}
		for _, l := range strings.Split(string(b), "\n") {
			f := strings.Split(l, ":")
			if len(f) != 3 {
				continue
			}
			start, err1 := strconv.Atoi(f[1])
			count, err2 := strconv.Atoi(f[2])
			if err1 == nil && err2 == nil && start+count > next {
				next = start + count
			}
		}
	}
	return next, nil
}

// usableTun makes /dev/net/tun usable by every user, as udev's default
// rule does on most machines (0666), for the rootless `--net open` side.
func (b *bench) usableTun() error {
	fi, err := os.Stat("/dev/net/tun")
	if err != nil {
		return err
	}
	if _, err := exec.LookPath("slirp4netns"); err != nil {
		return fmt.Errorf("rootless --net open needs slirp4netns: %w", err)
	}
	b.tunMode = fi.Mode().Perm()
	if b.tunMode == 0o666 {
		return nil
	}
	if err := os.Chmod("/dev/net/tun", 0o666); err != nil {
		return err
	}
	b.tunChanged = true
	return nil
}

// cleanup removes every sandbox and raw container, puts /dev/net/tun's
// mode back and removes the temporary directory. It runs once.
func (b *bench) cleanup() {
	if b.done {
		return
	}
	b.done = true
	ctx := context.Background()
	for _, s := range []*hutchSide{b.root, b.rootless} {
		if s == nil {
			continue
		}
		ids, _ := s.cmd(ctx, "ls", "-q")
		for _, id := range strings.Fields(ids) {
			if _, err := s.cmd(ctx, "rm", "-f", id); err != nil {
				progress("cleanup: %s hutch rm %s: %v", s.name, id, err)
			}
		}
	}
	if b.raw != nil {
		b.raw.cleanup()
	}
	if b.tunChanged {
		if err := os.Chmod("/dev/net/tun", b.tunMode); err != nil {
			progress("cleanup: /dev/net/tun back to %o: %v", b.tunMode, err)
		}
		b.tunChanged = false
	}
	if err := os.RemoveAll(b.tmp); err != nil {
		progress("cleanup: %v", err)
	}
}

func copyFile(src, dst string, mode os.FileMode) error {
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, mode)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// sandboxRecord is what the bench reads from `hutch inspect`.
type sandboxRecord struct {
	Rootfs string `json:"rootfs"`
	Pid    int    `json:"pid"`
}

func inspect(ctx context.Context, s *hutchSide, id string) (sandboxRecord, error) {
	var rec sandboxRecord
	out, err := s.cmd(ctx, "inspect", "--format", "debug", id)
	if err != nil {
		return rec, err
	}
	if err := json.Unmarshal([]byte(out), &rec); err != nil {
		return rec, fmt.Errorf("hutch inspect %s: %w", id, err)
	}
	return rec, nil
}

// loadAvg is the 1-minute load average.
func loadAvg() string {
	b, _ := os.ReadFile("/proc/loadavg")
	if f := strings.Fields(string(b)); len(f) > 0 {
		return f[0]
	}
	return "?"
}

// invocation is the command line of this run as the report shows it.
func invocation() string {
	args := []string{"go", "run", "./integration/bench/rootless"}
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

// machine describes the host for the report.
func machine() string {
	var kernel syscall.Utsname
	syscall.Uname(&kernel) //nolint:errcheck // best effort
	rel := make([]byte, 0, len(kernel.Release))
	for _, c := range kernel.Release {
		if c == 0 {
			break
		}
		rel = append(rel, byte(c))
	}
	return fmt.Sprintf("%d CPUs, Linux %s", runtime.NumCPU(), rel)
}
