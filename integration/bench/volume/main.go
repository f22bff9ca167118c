// Command volume measures a file-heavy workload (creating 10,000 small
// files, then `git status` over them) on a `-v DIR:PATH:rw` mount, on a
// `-v DIR:PATH:overlay` workspace and on the sandbox's own root
// filesystem, beside raw runsc with a plain bind mount, in one run, and
// writes the result into its own section of docs/benchmarks.md. Run it
// through `make bench` (as root).
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"hutch.dev/hutch/integration/bench/benchdoc"
	"hutch.dev/hutch/integration/bench/benchexit"
)

const (
	files = 10000
	reps  = 3
)

// workload runs in bash inside the sandbox, in directory $1 (made
// fresh): it prints the nanoseconds taken to create the files, then by a
// first and a second `git status`, then the number of paths git saw.
const workload = `set -e
mkdir -p "$1" && cd "$1"
git init -q .
t0=$(date +%s%N)
for i in $(seq 1 ` + "10000" + `); do echo "$i" > "f$i"; done
t1=$(date +%s%N)
n=$(git status --porcelain --untracked-files=all | wc -l)
t2=$(date +%s%N)
git status --porcelain --untracked-files=all >/dev/null
t3=$(date +%s%N)
echo $((t1-t0)) $((t2-t1)) $((t3-t2)) $n`

// bin holds the binaries; root is hutch's state root, a directory of
// top, beside the host directories.
var bin, top, root string

func hutch(args ...string) string {
	c := exec.Command(filepath.Join(bin, "hutch"), args...)
	c.Env = append(os.Environ(), "HUTCH_ROOT="+root)
	out, err := c.Output()
	if err != nil {
		msg := ""
		if ee, ok := err.(*exec.ExitError); ok {
			msg = string(ee.Stderr)
		}
		benchexit.Fatalf("hutch %s: %v: %s", strings.Join(args, " "), err, msg)
	}
	return string(out)
}

// sample is one workload run: create, first and second git status.
type sample [3]time.Duration

func parse(out string) sample {
	f := strings.Fields(out)
	if len(f) != 4 || f[3] != strconv.Itoa(files) {
		benchexit.Fatalf("workload printed %q, want three times and %d paths", out, files)
	}
	var s sample
	for i := range s {
		n, err := strconv.ParseInt(f[i], 10, 64)
		if err != nil {
			benchexit.Fatal(err)
		}
		s[i] = time.Duration(n)
	}
	return s
}

func median(ss []sample, i int) time.Duration {
	v := make([]time.Duration, len(ss))
	for j, s := range ss {
		v[j] = s[i]
	}
	sort.Slice(v, func(a, b int) bool { return v[a] < v[b] })
	return v[len(v)/2]
}

func ms(d time.Duration) string { return fmt.Sprintf("%.0f ms", float64(d.Microseconds())/1000) }

// hostDir makes a directory every user of the sandbox can write.
func hostDir(name string) string {
	d := filepath.Join(top, "host", name)
	if err := os.MkdirAll(d, 0o777); err != nil {
		benchexit.Fatal(err)
	}
	os.Chmod(d, 0o777)
	return d
}

func runscGlobals(pid int) []string {
	cl, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	if err != nil {
		benchexit.Fatal(err)
	}
	args := strings.Split(strings.TrimRight(string(cl), "\x00"), "\x00")
	for i, a := range args {
		if a == "boot" {
			return args[1:i]
		}
	}
	benchexit.Fatalf("process %d is not a runsc sandbox: %q", pid, args)
	return nil
}

func main() {
	flag.StringVar(&bin, "bin", "bin", "directory of the built hutch, hutch-init, runsc and images")
	out := flag.String("out", "docs/benchmarks.md", "benchmark document to update")
	baseArchive := flag.String("base", "", "import the default image from this archive (`hutch image export base:latest FILE`) instead of building it")
	flag.Parse()
	var err error
	if top, err = os.MkdirTemp("", "hutch-bench-volume-"); err != nil {
		benchexit.Fatal(err)
	}
	root = filepath.Join(top, "state")
	rawRoot := filepath.Join(top, "raw-runsc")
	cleanup := func() {
		c := exec.Command(filepath.Join(bin, "hutch"), "ls", "-q")
		c.Env = append(os.Environ(), "HUTCH_ROOT="+root)
		ids, _ := c.Output()
		for _, id := range strings.Fields(string(ids)) {
			rm := exec.Command(filepath.Join(bin, "hutch"), "rm", "-f", id)
			rm.Env = c.Env
			rm.Run() //nolint:errcheck // best effort on the way out
		}
		exec.Command(filepath.Join(bin, "runsc"), "--root="+rawRoot, "delete", "--force", "bench-volume-raw").Run() //nolint:errcheck
		os.RemoveAll(top)
	}
	benchexit.AtExit(cleanup)
	defer cleanup()

	if *baseArchive != "" {
		hutch("image", "import", "base", *baseArchive)
	}
	hutch("run", "--rm", "--image", "base", "--", "true") // builds base if needed

	rw, ov := hostDir("rw"), hostDir("overlay")
	id := strings.TrimSpace(hutch("create", "--image", "base", "-v", rw+":/bench-rw", "-v", ov+":/bench-overlay:overlay"))
	run := func(dir string) sample {
		return parse(hutch("exec", "-u", "root", id, "--", "bash", "-c", workload, "bench", dir))
	}
	var rwS, ovS, rootS, rawS []sample
	for i := 0; i < reps; i++ {
		rwS = append(rwS, run(fmt.Sprintf("/bench-rw/%d", i)))
		ovS = append(ovS, run(fmt.Sprintf("/bench-overlay/%d", i)))
		rootS = append(rootS, run(fmt.Sprintf("/var/tmp/bench/%d", i)))
	}
	if fi, _ := os.ReadDir(ov); len(fi) != 0 {
		benchexit.Fatalf("the overlay workspace's writes reached its host directory")
	}

	// Raw runsc: the sandbox's own spec and global flags, its init the
	// workload, and a plain bind mount of a host directory.
	// The gVisor sandbox process, whose flags are hutch's runsc flags.
	pb, err := os.ReadFile(filepath.Join(root, "sandboxes", id, "sandbox.pid"))
	if err != nil {
		benchexit.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(pb)))
	if err != nil {
		benchexit.Fatal(err)
	}
	globals := runscGlobals(pid)
	b, err := os.ReadFile(filepath.Join(root, "sandboxes", id, "bundle", "config.json"))
	if err != nil {
		benchexit.Fatal(err)
	}
	var spec specs.Spec
	if err := json.Unmarshal(b, &spec); err != nil {
		benchexit.Fatal(err)
	}
	rawHost := hostDir("raw")
	var mounts []specs.Mount
	for _, m := range spec.Mounts {
		if m.Type == "bind" && (strings.HasPrefix(m.Source, root) || m.Destination == "/.hutch/hutch-init") {
			continue
		}
		mounts = append(mounts, m)
	}
	spec.Mounts = append(mounts, specs.Mount{Destination: "/bench-raw", Type: "bind", Source: rawHost, Options: []string{"rbind", "rw"}})
	spec.Annotations = nil
	spec.Linux.CgroupsPath = ""
	for i, ns := range spec.Linux.Namespaces {
		if ns.Type == specs.NetworkNamespace {
			spec.Linux.Namespaces[i].Path = ""
		}
	}
	spec.Process.Terminal = false
	spec.Process.User = specs.User{}
	var rawGlobals []string
	for _, g := range globals {
		switch {
		case strings.HasPrefix(g, "--root="):
			rawGlobals = append(rawGlobals, "--root="+rawRoot)
		case strings.HasPrefix(g, "--overlay2="):
			rawGlobals = append(rawGlobals, "--overlay2=root:dir="+filepath.Join(top, "raw-overlay"))
		case strings.HasPrefix(g, "--network="):
			rawGlobals = append(rawGlobals, "--network=none")
		default:
			rawGlobals = append(rawGlobals, g)
		}
	}
	os.MkdirAll(filepath.Join(top, "raw-overlay"), 0o700)
	for i := 0; i < reps; i++ {
		spec.Process.Args = []string{"bash", "-c", workload, "bench", fmt.Sprintf("/bench-raw/%d", i)}
		bundle := filepath.Join(top, "raw-bundle")
		os.MkdirAll(bundle, 0o700)
		sb, _ := json.Marshal(&spec)
		if err := os.WriteFile(filepath.Join(bundle, "config.json"), sb, 0o600); err != nil {
			benchexit.Fatal(err)
		}
		c := exec.Command(filepath.Join(bin, "runsc"), append(rawGlobals, "run", "--bundle", bundle, "bench-volume-raw")...)
		o, err := c.Output()
		if err != nil {
			msg := ""
			if ee, ok := err.(*exec.ExitError); ok {
				msg = string(ee.Stderr)
			}
			benchexit.Fatalf("raw runsc run: %v: %s %s", err, o, msg)
		}
		rawS = append(rawS, parse(string(o)))
	}

	runscVersion := "runsc ?"
	if v, err := exec.Command(filepath.Join(bin, "runsc"), "--version").Output(); err == nil {
		runscVersion = strings.SplitN(strings.TrimSpace(string(v)), "\n", 2)[0]
	}
	var w strings.Builder
	fmt.Fprintf(&w, "### Volumes and overlay workspaces (file-heavy work)\n\n")
	fmt.Fprintf(&w, "`go run ./integration/bench/volume`, %s, %d CPUs, %s, %s. ", time.Now().UTC().Format("2006-01-02"), runtime.NumCPU(), runtime.GOOS+"/"+runtime.GOARCH, runscVersion)
	fmt.Fprintf(&w, "Inside one sandbox of the default image, as root, bash creates %d small files (`echo $i > f$i`) in a fresh directory that is a git repository, then runs `git status --porcelain --untracked-files=all` over them twice; times are taken inside the sandbox (`date +%%s%%N`), medians of %d runs. "+
		"*rw mount*: `-v DIR:/bench-rw` (a gofer bind mount, shared file access: every lookup revalidated against the host). "+
		"*overlay workspace*: `-v DIR:/bench-overlay:overlay` (a host overlayfs whose upper layer is in the sandbox's state directory, bind-mounted the same way). "+
		"*sandbox rootfs*: `/var/tmp` on the sandbox's own root filesystem (gVisor's overlay, upper layer in a file under the sandbox's state directory, `--overlay2=root:dir=`). "+
		"*raw runsc*: `runsc run` with the sandbox's spec and global flags and a plain bind mount of a host directory. The machine is shared: compare columns, not runs.\n\n", files, reps)
	fmt.Fprintf(&w, "| where | create %d files | first `git status` | second `git status` |\n| --- | --- | --- | --- |\n", files)
	for _, r := range []struct {
		name string
		s    []sample
	}{{"hutch, rw mount", rwS}, {"hutch, overlay workspace", ovS}, {"hutch, sandbox rootfs", rootS}, {"raw runsc, bind mount", rawS}} {
		fmt.Fprintf(&w, "| %s | %s | %s | %s |\n", r.name, ms(median(r.s, 0)), ms(median(r.s, 1)), ms(median(r.s, 2)))
	}
	if err := benchdoc.WriteSection(*out, "volume", w.String()); err != nil {
		benchexit.Fatal(err)
	}
	fmt.Print(w.String())
}
