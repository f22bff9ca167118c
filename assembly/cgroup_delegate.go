package assembly

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/containerd/cgroups/v3"
	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// A rootless sandbox has limits from the host only where the host hands
// the user a cgroup v2 subtree of their own: systemd's user@UID.service
// (and the scopes below it made with Delegate=yes), whose directory and
// control files belong to the user. Sandboxes go below it, in
// <delegated>/hutch/<ID>, with the same limits a root sandbox gets.

// Delegation is a cgroup v2 subtree delegated to the calling user.
type Delegation struct {
	// Mount is where the cgroup2 hierarchy is mounted.
	Mount string
	// Path is the delegated cgroup, relative to Mount
	// (/user.slice/user-1000.slice/user@1000.service).
	Path string
	// Controllers are those of cpu, memory and pids the subtree may
	// enable (its cgroup.controllers).
	Controllers []string
}

// LimitControllers are the controllers sandbox limits need: --cpus,
// --memory and the host's pids backstop.
var LimitControllers = []string{"cpu", "memory", "pids"}

// Has reports whether the delegated subtree offers controller c.
func (d Delegation) Has(c string) bool { return slices.Contains(d.Controllers, c) }

// HostDelegation finds the cgroup v2 subtree this process's user may
// manage: FindDelegation for this process on a unified host. Hybrid and
// v1 hosts give users none (ErrNotFound).
func HostDelegation() (Delegation, error) {
	if cgroups.Mode() != cgroups.Unified {
		return Delegation{}, fmt.Errorf("the host's cgroups are not unified v2 (only v2 can be delegated to a user): %w", errdefs.ErrNotFound)
	}
	self, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return Delegation{}, err
	}
	return FindDelegation(Cgroup2Mount, self, os.Geteuid())
}

// FindDelegation finds the subtree of the cgroup2 hierarchy at mount
// delegated to uid, starting from the cgroup of a process whose
// /proc/PID/cgroup is procCgroup: the highest of that cgroup and its
// ancestors whose directory, cgroup.procs and cgroup.subtree_control uid
// owns. The process must be inside it: moving a process into a cgroup
// needs write access to the common ancestor of both. It wraps
// errdefs.ErrNotFound when there is none (a login session's scope is
// root's: `systemd-run --user --scope` puts a command in the user's
// manager, which is delegated).
func FindDelegation(mount string, procCgroup []byte, uid int) (Delegation, error) {
	own := ""
	sc := bufio.NewScanner(bytes.NewReader(procCgroup))
	for sc.Scan() {
		if p, ok := strings.CutPrefix(sc.Text(), "0::"); ok {
			own = p
		}
	}
	if own == "" || !strings.HasPrefix(own, "/") {
		return Delegation{}, fmt.Errorf("this process has no cgroup v2 path: %w", errdefs.ErrNotFound)
	}
	found := ""
	for p := filepath.Clean(own); ; p = filepath.Dir(p) {
		if !ownedBy(filepath.Join(mount, p), uid) {
			break
		}
		found = p
		if p == "/" {
			break
		}
	}
	if found == "" {
		return Delegation{}, fmt.Errorf("no cgroup delegated to uid %d contains this process's cgroup %s (run hutch under `systemd-run --user --scope`, or as a service of the user's systemd): %w", uid, own, errdefs.ErrNotFound)
	}
	d := Delegation{Mount: mount, Path: found}
	b, err := os.ReadFile(filepath.Join(mount, found, "cgroup.controllers"))
	if err != nil {
		return Delegation{}, fmt.Errorf("delegated cgroup %s: %w", found, err)
	}
	for _, c := range strings.Fields(string(b)) {
		if slices.Contains(LimitControllers, c) {
			d.Controllers = append(d.Controllers, c)
		}
	}
	return d, nil
}

// ownedBy reports whether the cgroup directory dir and the files that
// delegate it belong to uid.
func ownedBy(dir string, uid int) bool {
	for _, p := range []string{dir, filepath.Join(dir, "cgroup.procs"), filepath.Join(dir, "cgroup.subtree_control")} {
		fi, err := os.Stat(p)
		if err != nil {
			return false
		}
		st, ok := fi.Sys().(*syscall.Stat_t)
		if !ok || int(st.Uid) != uid {
			return false
		}
	}
	return true
}

// SandboxPath is the cgroup of sandbox id in d, relative to d.Mount.
func (d Delegation) SandboxPath(id string) string {
	return filepath.Join(d.Path, "hutch", id)
}

// CreateDelegated creates the cgroup at path (a SandboxPath of a
// Delegation at mount) with the limits of res that the subtree's
// controllers allow, enabling those controllers in the cgroups between:
// as CreateCgroup does for root, runsc then joins it. It returns the
// controllers whose limits it set. On error nothing of the sandbox's
// cgroup is left.
func CreateDelegated(mount, path string, res *specs.LinuxResources) ([]string, error) {
	parent := filepath.Dir(path)
	delegated := filepath.Dir(parent)
	b, err := os.ReadFile(filepath.Join(mount, delegated, "cgroup.controllers"))
	if err != nil {
		return nil, fmt.Errorf("delegated cgroup %s: %w", delegated, err)
	}
	var ctrls []string
	for _, c := range strings.Fields(string(b)) {
		if slices.Contains(LimitControllers, c) {
			ctrls = append(ctrls, c)
		}
	}
	enable := ""
	for _, c := range ctrls {
		enable += " +" + c
	}
	enable = strings.TrimSpace(enable)
	if err := os.Mkdir(filepath.Join(mount, parent), 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
		return nil, fmt.Errorf("create cgroup %s: %w", parent, err)
	}
	if enable != "" {
		for _, p := range []string{delegated, parent} {
			if err := writeCgroupFile(mount, p, "cgroup.subtree_control", enable); err != nil {
				return nil, err
			}
		}
	}
	dir := filepath.Join(mount, path)
	if err := os.Mkdir(dir, 0o755); err != nil {
		return nil, fmt.Errorf("create cgroup %s: %w", path, err)
	}
	files := delegatedLimits(res, ctrls)
	names := make([]string, 0, len(files))
	for f := range files {
		names = append(names, f)
	}
	slices.Sort(names)
	for _, f := range names {
		if err := writeCgroupFile(mount, path, f, files[f]); err != nil {
			if rerr := RemoveDelegated(mount, path); rerr != nil {
				err = errors.Join(err, rerr)
			}
			return nil, err
		}
	}
	return ctrls, nil
}

// delegatedLimits are the cgroup v2 files that set res's limits, for the
// controllers ctrls.
func delegatedLimits(res *specs.LinuxResources, ctrls []string) map[string]string {
	out := map[string]string{}
	if res == nil {
		return out
	}
	if slices.Contains(ctrls, "cpu") && res.CPU != nil && res.CPU.Quota != nil && *res.CPU.Quota > 0 {
		period := uint64(100000)
		if res.CPU.Period != nil && *res.CPU.Period > 0 {
			period = *res.CPU.Period
		}
		out["cpu.max"] = strconv.FormatInt(*res.CPU.Quota, 10) + " " + strconv.FormatUint(period, 10)
	}
	if slices.Contains(ctrls, "memory") && res.Memory != nil && res.Memory.Limit != nil && *res.Memory.Limit > 0 {
		out["memory.max"] = strconv.FormatInt(*res.Memory.Limit, 10)
		// What the sandbox cannot keep in memory it may not push to swap
		// either, as for root's sandboxes.
		out["memory.swap.max"] = "0"
	}
	if slices.Contains(ctrls, "pids") && res.Pids != nil && res.Pids.Limit != nil && *res.Pids.Limit > 0 {
		out["pids.max"] = strconv.FormatInt(*res.Pids.Limit, 10)
	}
	return out
}

func writeCgroupFile(mount, path, file, value string) error {
	p := filepath.Join(mount, path, file)
	if file == "memory.swap.max" && !fileExists(p) {
		return nil // no swap accounting on this host
	}
	// cgroupfs makes a cgroup's control files itself and refuses to
	// create others: O_CREATE only matters on a plain directory (tests).
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_TRUNC|os.O_CREATE, 0o644)
	if err != nil {
		return fmt.Errorf("cgroup %s: %w", path, err)
	}
	_, err = f.WriteString(value)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("cgroup %s: write %q to %s: %w", path, value, file, err)
	}
	return nil
}

// RemoveDelegated removes the sandbox cgroup at path under mount, killing
// what is still in it (cgroup.kill); a missing cgroup is not an error.
func RemoveDelegated(mount, path string) error {
	dir := filepath.Join(mount, path)
	if _, err := os.Stat(dir); errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if kill := filepath.Join(dir, "cgroup.kill"); fileExists(kill) {
		_ = os.WriteFile(kill, []byte("1"), 0)
	}
	var err error
	for i := 0; i < 100; i++ {
		// On cgroupfs the directory goes once it is empty of processes;
		// its control files go with it.
		if err = os.RemoveAll(dir); err == nil {
			return nil
		}
		time.Sleep(10 * time.Millisecond)
	}
	return fmt.Errorf("remove cgroup %s: %w", path, err)
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}
