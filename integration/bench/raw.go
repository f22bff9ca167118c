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
	"strings"
	"syscall"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// rawCgroupPrefix starts the name of the cgroup under which one run's raw
// runsc containers run, each with the same resources hutch sets on its own
// sandboxes.
const rawCgroupPrefix = "/hutch-bench-"

// rawSide drives runsc directly, the way a user of runsc would: its own
// state root, a bundle written beforehand, the same global flags as hutch.
type rawSide struct {
	runsc string
	// root is runsc's --root for raw containers.
	root string
	// dir holds one directory (bundle + overlay file) per raw container.
	dir string
	// overlay is hutch's --overlay2 value with its directory left out:
	// the options after "root:dir=PATH" (",size=N"). Each raw container
	// gets its own directory.
	overlay string
	// extra are hutch's runsc global flags other than --root and
	// --overlay2 (--network, --gofer-network-namespace, ...), read from
	// one of its sandbox processes.
	extra []string
	// spec is hutch's generated spec; each raw container gets a copy with
	// its own process and cgroup.
	spec specs.Spec
	// cgroupParent is this run's parent cgroup of raw containers.
	cgroupParent string
	// live are raw containers not yet deleted.
	live map[string]bool
}

// globals are the runsc global flags of raw container id: those hutch uses,
// with runsc's state in r.root and the overlay file in the container's own
// directory.
func (r *rawSide) globals(id string) []string {
	g := []string{
		"--root=" + r.root,
		"--overlay2=root:dir=" + filepath.Join(r.dir, id) + r.overlay,
	}
	return append(g, r.extra...)
}

// setGlobals takes the flags of hutch's sandboxes, as runscGlobals reads
// them, as the model of the raw side's.
func (r *rawSide) setGlobals(hutchGlobals []string) error {
	r.extra = nil
	seen := 0
	for _, g := range hutchGlobals {
		switch {
		case strings.HasPrefix(g, "--root="):
			seen++
		case strings.HasPrefix(g, "--overlay2="):
			v := strings.TrimPrefix(g, "--overlay2=")
			if !strings.HasPrefix(v, "root:dir=") {
				return fmt.Errorf("hutch's --overlay2=%s has no directory to replace", v)
			}
			r.overlay = ""
			if _, opts, ok := strings.Cut(v, ","); ok {
				r.overlay = "," + opts
			}
			seen++
		case strings.HasPrefix(g, "--") && strings.Contains(g, "="):
			r.extra = append(r.extra, g)
		default:
			return fmt.Errorf("unexpected runsc flag %q in %q", g, hutchGlobals)
		}
	}
	if seen != 2 {
		return fmt.Errorf("no --root or --overlay2 among hutch's runsc flags %q", hutchGlobals)
	}
	return nil
}

// prepare writes the bundle of raw container id, running args as its init,
// and returns the bundle directory. It is not part of any timing.
func (r *rawSide) prepare(id string, args []string) (string, error) {
	s := r.spec
	// Copy what is modified, so that r.spec stays as hutch wrote it.
	p := *s.Process
	p.Args = args
	p.Terminal = false
	s.Process = &p
	root := *s.Root
	root.Readonly = false
	s.Root = &root
	linux := *s.Linux
	linux.CgroupsPath = r.cgroupParent + "/" + id
	s.Linux = &linux
	s.Annotations = nil

	bundle := filepath.Join(r.dir, id, "bundle")
	if err := os.MkdirAll(bundle, 0o700); err != nil {
		return "", err
	}
	b, err := json.MarshalIndent(&s, "", "\t")
	if err != nil {
		return "", err
	}
	if err := os.WriteFile(filepath.Join(bundle, "config.json"), b, 0o600); err != nil {
		return "", err
	}
	r.live[id] = true
	return bundle, nil
}

// run times `runsc run` of a container whose init is args.
func (r *rawSide) run(ctx context.Context, id string, args []string) (result, error) {
	bundle, err := r.prepare(id, args)
	if err != nil {
		return result{}, err
	}
	cmd := append(r.globals(id), "run", "--bundle", bundle, id)
	return timed(ctx, runOpts{}, r.runsc, cmd...)
}

// runDetached times `runsc run --detach` of a container whose init is
// args: created and started, left running.
func (r *rawSide) runDetached(ctx context.Context, id string, args []string) (result, error) {
	bundle, err := r.prepare(id, args)
	if err != nil {
		return result{}, err
	}
	return timed(ctx, runOpts{discardStdout: true}, r.runsc,
		append(r.globals(id), "run", "--detach", "--bundle", bundle, id)...)
}

// remove times `runsc delete --force`, then removes the container's
// cgroup and directory (untimed). A container runsc already deleted (run
// deletes its container when the init exits) is only cleaned up.
func (r *rawSide) remove(ctx context.Context, id string) (result, error) {
	var res result
	var err error
	if r.exists(id) {
		res, err = timed(ctx, runOpts{discardStdout: true}, r.runsc, append(r.globals(id), "delete", "--force", id)...)
	}
	removeCgroup(r.cgroupParent + "/" + id)
	if rmErr := os.RemoveAll(filepath.Join(r.dir, id)); rmErr != nil && err == nil {
		err = rmErr
	}
	if err == nil {
		delete(r.live, id)
	}
	return res, err
}

// exists reports whether runsc still has state for container id.
func (r *rawSide) exists(id string) bool {
	m, _ := filepath.Glob(filepath.Join(r.root, id+"_sandbox:*.state"))
	return len(m) > 0
}

// cleanup deletes every raw container left and the cgroup parent.
func (r *rawSide) cleanup() {
	for id := range r.live {
		if r.exists(id) {
			args := append(r.globals(id), "delete", "--force", id)
			if out, err := exec.Command(r.runsc, args...).CombinedOutput(); err != nil {
				progress("cleanup: runsc delete %s: %v: %s", id, err, strings.TrimSpace(string(out)))
			}
		}
		removeCgroup(r.cgroupParent + "/" + id)
		os.RemoveAll(filepath.Join(r.dir, id))
	}
	removeCgroup(r.cgroupParent)
}

// unmountNullNetNS removes the bind mounts runsc may stack at
// ROOT/null-netns (its shared gofer network namespace) so that root can be
// deleted.
func unmountNullNetNS(root string) {
	for syscall.Unmount(filepath.Join(root, "null-netns"), syscall.MNT_DETACH) == nil {
	}
}

// removeCgroup removes cgroup path (as in an OCI spec's cgroupsPath) from
// every mounted cgroup hierarchy, v1 or v2, if it is there and empty.
func removeCgroup(path string) {
	for _, m := range cgroupMounts() {
		err := syscall.Rmdir(filepath.Join(m, path))
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			progress("cleanup: cgroup %s: %v", filepath.Join(m, path), err)
		}
	}
}

// cgroupMounts lists the mount points of cgroup and cgroup2 filesystems.
func cgroupMounts() []string {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTS [OPTIONAL...] - FSTYPE SOURCE SUPER
		fields := strings.Fields(sc.Text())
		for i, f := range fields {
			if f == "-" && i+1 < len(fields) && len(fields) > 4 {
				if t := fields[i+1]; t == "cgroup" || t == "cgroup2" {
					out = append(out, fields[4])
				}
				break
			}
		}
	}
	return out
}
