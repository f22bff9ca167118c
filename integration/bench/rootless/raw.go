package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// rawSide drives runsc directly, as root, as a user of runsc would: a
// bundle with the spec root's hutch wrote for a `--net none` sandbox, the
// runsc flags that sandbox runs with, its own state root.
type rawSide struct {
	runner
	runsc, root string
	// work holds one directory per container (bundle, overlay file).
	work string
	// flags are the sandbox's runsc flags but --root and --overlay2;
	// overlay is --overlay2's options after its directory.
	flags   []string
	overlay string
	spec    specs.Spec
	// cgroup is the parent cgroup of this run's containers.
	cgroup string
	live   map[string]bool
}

func newRawSide(ctx context.Context, s *hutchSide, id, runsc, dir string) (*rawSide, error) {
	r := &rawSide{runsc: runsc, root: filepath.Join(dir, "state"), work: dir, live: map[string]bool{},
		cgroup: "/hutch-rbench-" + strconv.Itoa(os.Getpid())}
	r.runner = runner{env: []string{}, dir: "/"}
	if err := os.MkdirAll(r.root, 0o700); err != nil {
		return nil, err
	}
	rec, err := inspect(ctx, s, id)
	if err != nil {
		return nil, err
	}
	specPath := filepath.Join(s.root, "sandboxes", id, "bundle", "config.json")
	b, err := os.ReadFile(specPath)
	if err != nil {
		return nil, err
	}
	if err := json.Unmarshal(b, &r.spec); err != nil {
		return nil, fmt.Errorf("%s: %w", specPath, err)
	}
	if r.spec.Process == nil || r.spec.Linux == nil || r.spec.Root == nil || r.spec.Root.Path != rec.Rootfs {
		return nil, fmt.Errorf("%s: not the spec of sandbox %s", specPath, id)
	}
	cl, err := os.ReadFile("/proc/" + strconv.Itoa(rec.Pid) + "/cmdline")
	if err != nil {
		return nil, err
	}
	args := strings.Split(strings.TrimRight(string(cl), "\x00"), "\x00")
	boot := -1
	for i, a := range args {
		if a == "boot" {
			boot = i
			break
		}
	}
	if boot < 0 {
		return nil, fmt.Errorf("process %d is not a runsc sandbox: %q", rec.Pid, args)
	}
	seen := 0
	for _, g := range args[1:boot] {
		switch {
		case strings.HasPrefix(g, "--root="):
			seen++
		case strings.HasPrefix(g, "--overlay2=root:dir="):
			if _, opts, ok := strings.Cut(g, ","); ok {
				r.overlay = "," + opts
			}
			seen++
		case strings.HasPrefix(g, "--") && strings.Contains(g, "="):
			r.flags = append(r.flags, g)
		default:
			return nil, fmt.Errorf("unexpected runsc flag %q", g)
		}
	}
	if seen != 2 {
		return nil, fmt.Errorf("no --root or --overlay2 among the sandbox's runsc flags %q", args[1:boot])
	}
	return r, nil
}

// globals are container id's runsc flags: the sandbox's, with this side's
// state root and an overlay directory of the container's own.
func (r *rawSide) globals(id string) []string {
	return append([]string{"--root=" + r.root, "--overlay2=root:dir=" + filepath.Join(r.work, id) + r.overlay}, r.flags...)
}

// prepare writes container id's bundle, with args as its init.
func (r *rawSide) prepare(id string, args []string) (string, error) {
	s := r.spec
	p := *s.Process
	p.Args, p.Terminal = args, false
	s.Process = &p
	root := *s.Root
	root.Readonly = false
	s.Root = &root
	linux := *s.Linux
	linux.CgroupsPath = r.cgroup + "/" + id
	s.Linux = &linux
	s.Annotations = nil
	bundle := filepath.Join(r.work, id, "bundle")
	if err := os.MkdirAll(bundle, 0o700); err != nil {
		return "", err
	}
	b, err := json.Marshal(&s)
	if err != nil {
		return "", err
	}
	r.live[id] = true
	return bundle, os.WriteFile(filepath.Join(bundle, "config.json"), b, 0o600)
}

// run times `runsc run` of a container whose init is args.
func (r *rawSide) run(ctx context.Context, id string, args ...string) (result, error) {
	bundle, err := r.prepare(id, args)
	if err != nil {
		return result{}, err
	}
	return r.timed(ctx, r.runsc, append(r.globals(id), "run", "--bundle", bundle, id)...)
}

// runDetached times `runsc run --detach` of a container with the spec's
// own init (hutch-init), left running.
func (r *rawSide) runDetached(ctx context.Context, id string) (result, error) {
	bundle, err := r.prepare(id, r.spec.Process.Args)
	if err != nil {
		return result{}, err
	}
	return r.timedQuiet(ctx, append(r.globals(id), "run", "--detach", "--bundle", bundle, id)...)
}

// timedQuiet times a runsc call whose daemons keep its stdout: stdout is
// /dev/null, so that no pipe waits for them.
func (r *rawSide) timedQuiet(ctx context.Context, args ...string) (result, error) {
	return r.timedOut(ctx, false, r.runsc, args...)
}

func (r *rawSide) exec(ctx context.Context, id string, args ...string) (result, error) {
	return r.timed(ctx, r.runsc, append(append(r.globals(id), "exec", id), args...)...)
}

// remove times `runsc delete --force` if runsc has state for id, then
// removes its cgroup and directory (untimed).
func (r *rawSide) remove(ctx context.Context, id string) (result, error) {
	var res result
	var err error
	if r.exists(id) {
		res, err = r.timedQuiet(ctx, append(r.globals(id), "delete", "--force", id)...)
	}
	removeCgroup(r.cgroup + "/" + id)
	if rmErr := os.RemoveAll(filepath.Join(r.work, id)); rmErr != nil && err == nil {
		err = rmErr
	}
	if err == nil {
		delete(r.live, id)
	}
	return res, err
}

func (r *rawSide) exists(id string) bool {
	m, _ := filepath.Glob(filepath.Join(r.root, id+"_sandbox:*.state"))
	return len(m) > 0
}

func (r *rawSide) cleanup() {
	for id := range r.live {
		if r.exists(id) {
			if out, err := exec.Command(r.runsc, append(r.globals(id), "delete", "--force", id)...).CombinedOutput(); err != nil {
				progress("cleanup: runsc delete %s: %v: %s", id, err, strings.TrimSpace(string(out)))
			}
		}
		removeCgroup(r.cgroup + "/" + id)
	}
	removeCgroup(r.cgroup)
	for syscall.Unmount(filepath.Join(r.root, "null-netns"), syscall.MNT_DETACH) == nil {
	}
}

// removeCgroup removes cgroup path from every mounted cgroup hierarchy,
// if it is there and empty.
func removeCgroup(path string) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		for i, fl := range fields {
			if fl == "-" && i+1 < len(fields) && len(fields) > 4 {
				if t := fields[i+1]; t == "cgroup" || t == "cgroup2" {
					p := filepath.Join(fields[4], path)
					if err := syscall.Rmdir(p); err != nil && !errors.Is(err, os.ErrNotExist) {
						progress("cleanup: cgroup %s: %v", p, err)
					}
				}
				break
			}
		}
	}
}
