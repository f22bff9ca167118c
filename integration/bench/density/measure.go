package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// usage is what a set of host processes holds.
type usage struct {
	procs, threads int
	pss, rss       int64 // bytes
}

func (u *usage) add(o usage) {
	u.procs += o.procs
	u.threads += o.threads
	u.pss += o.pss
	u.rss += o.rss
}

// hostUsage is one scan of /proc, split by whose the processes are.
type hostUsage struct {
	runsc   usage // hutch's sandboxes: runsc sandbox, gofer and stub processes
	helpers usage // hutch's own per-sandbox helpers (resolver, forwarder, watchdog): hutch-helper, or hutch itself
	raw     usage // the raw runsc sandboxes
	// kinds splits helpers by their hutch subcommand.
	kinds map[string]usage
}

// helperKinds are the subcommands hutch and hutch-helper run the per-sandbox
// helpers as.
var helperKinds = []string{"__dns-resolver", "port-forward", "lifetime-watchdog"}

// helperKind is the helper subcommand in args, or "other".
func helperKind(args [][]byte) string {
	for _, a := range args[1:] {
		for _, k := range helperKinds {
			if string(a) == k {
				return k
			}
		}
	}
	return "other"
}

// scanHost reads every process once. A process is hutch's if its command
// line names hutch's state root (runsc's --root, a helper's arguments), raw
// runsc's if it names rawRoot; descendants (systrap's stubs, which have no
// command line of their own) count with their ancestor.
func scanHost(root, rawRoot string) (hostUsage, error) {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return hostUsage{}, err
	}
	const (
		none = iota
		hutchRunsc
		hutchHelper
		rawRunsc
	)
	parent := map[int]int{}
	class := map[int]int{}
	kind := map[int]string{}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		pp, err := ppid(pid)
		if err != nil {
			continue
		}
		parent[pid] = pp
		cl, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err != nil || len(cl) == 0 {
			continue
		}
		args := bytes.Split(bytes.TrimRight(cl, "\x00"), []byte{0})
		exe := filepath.Base(string(args[0]))
		switch {
		case bytes.Contains(cl, []byte(rawRoot)):
			class[pid] = rawRunsc
		case !bytes.Contains(cl, []byte(root+"/")) && !bytes.Contains(cl, append([]byte(root), 0)):
		case strings.HasPrefix(exe, "runsc"):
			class[pid] = hutchRunsc
		case exe == "hutch" || exe == "hutch-helper":
			class[pid] = hutchHelper
			kind[pid] = helperKind(args)
		}
	}
	// Descendants take their nearest classified ancestor's class.
	var classOf func(pid, depth int) int
	classOf = func(pid, depth int) int {
		if c, ok := class[pid]; ok || depth > 8 {
			return c
		}
		pp, ok := parent[pid]
		if !ok || pp <= 1 {
			return none
		}
		return classOf(pp, depth+1)
	}
	h := hostUsage{kinds: map[string]usage{}}
	for pid := range parent {
		c := classOf(pid, 0)
		if c == none {
			continue
		}
		u, err := procUsage(pid)
		if err != nil {
			continue // exited meanwhile
		}
		switch c {
		case hutchRunsc:
			h.runsc.add(u)
		case hutchHelper:
			h.helpers.add(u)
			k := h.kinds[kind[pid]]
			k.add(u)
			h.kinds[kind[pid]] = k
		case rawRunsc:
			h.raw.add(u)
		}
	}
	return h, nil
}

// procUsage is one process's PSS, RSS and thread count.
func procUsage(pid int) (usage, error) {
	p := "/proc/" + strconv.Itoa(pid)
	rollup, err := os.ReadFile(p + "/smaps_rollup")
	if err != nil {
		return usage{}, err
	}
	status, err := os.ReadFile(p + "/status")
	if err != nil {
		return usage{}, err
	}
	u := usage{procs: 1}
	if u.pss, err = kBField(rollup, "Pss:"); err != nil {
		return u, fmt.Errorf("pid %d: %w", pid, err)
	}
	if u.rss, err = kBField(rollup, "Rss:"); err != nil {
		return u, fmt.Errorf("pid %d: %w", pid, err)
	}
	t, err := kBField(status, "Threads:")
	if err != nil {
		return u, fmt.Errorf("pid %d: %w", pid, err)
	}
	u.threads = int(t / 1024)
	return u, nil
}

// kBField reads "Field: N [kB]" from a /proc file, as bytes when in kB.
func kBField(b []byte, field string) (int64, error) {
	for _, line := range strings.Split(string(b), "\n") {
		if !strings.HasPrefix(line, field) {
			continue
		}
		f := strings.Fields(strings.TrimPrefix(line, field))
		if len(f) == 0 {
			break
		}
		n, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			return 0, err
		}
		return n * 1024, nil
	}
	return 0, fmt.Errorf("no %s", field)
}

// ppid is field 4 of /proc/PID/stat.
func ppid(pid int) (int, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, err
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, fmt.Errorf("bad /proc/%d/stat", pid)
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 2 {
		return 0, fmt.Errorf("bad /proc/%d/stat", pid)
	}
	return strconv.Atoi(f[1])
}

// cgroupMemory is the memory charged to the cgroup at path (an OCI
// cgroupsPath such as /hutch/ID): cgroup v2's memory.current or v1's
// memory.usage_in_bytes.
func cgroupMemory(path string) (int64, error) {
	for _, f := range []string{
		filepath.Join("/sys/fs/cgroup", path, "memory.current"),
		filepath.Join("/sys/fs/cgroup/memory", path, "memory.usage_in_bytes"),
	} {
		b, err := os.ReadFile(f)
		if err == nil {
			return strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
		}
	}
	return 0, fmt.Errorf("no memory controller for cgroup %s", path)
}

// memAvailable is the host's MemAvailable in bytes.
func memAvailable() int64 {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0
	}
	n, _ := kBField(b, "MemAvailable:")
	return n
}
