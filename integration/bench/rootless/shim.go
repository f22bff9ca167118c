package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// The phases of `hutch create` are found with shims: hard links to a copy of
// this program, named after the commands hutch starts (runsc through
// `hutch --runsc`, the others through a PATH that has the shims first).
// Each notes the time and what it is about to run, then execs the real
// command. A hard link, unlike a symbolic one, is what /proc/self/exe
// names, so the shim knows its own name and finds its configuration
// beside it whatever argv[0] it was given.
const (
	shimConf = "rbench-shim.json"
	shimSelf = "rbench"
)

// shimmed are the commands hutch starts on the way to a sandbox that the
// shims time, besides runsc.
var shimmed = []string{"nsenter", "unshare", "sleep", "slirp4netns"}

// shimConfig is the configuration beside the shims.
type shimConfig struct {
	Log  string            `json:"log"`
	Real map[string]string `json:"real"`
}

// asShim runs this program as a shim if it is one, and does not return.
func asShim() {
	exe, err := os.Executable()
	if err != nil || filepath.Base(exe) == shimSelf {
		return
	}
	b, err := os.ReadFile(filepath.Join(filepath.Dir(exe), shimConf))
	if err != nil {
		return
	}
	var c shimConfig
	name := filepath.Base(exe)
	if json.Unmarshal(b, &c) != nil || c.Real[name] == "" {
		return
	}
	now := time.Now().UnixNano()
	if f, err := os.OpenFile(c.Log, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600); err == nil {
		fmt.Fprintf(f, "%d %d %s\n", now, os.Getpid(), shimLabel(name, os.Args[1:]))
		f.Close()
	}
	real := c.Real[name]
	err = syscall.Exec(real, append([]string{real}, os.Args[1:]...), os.Environ())
	fmt.Fprintf(os.Stderr, "shim: exec %s: %v\n", real, err)
	os.Exit(125)
}

// shimLabel names a call for the phase table.
func shimLabel(name string, args []string) string {
	switch name {
	case "runsc":
		known := []string{"create", "start", "state", "exec", "delete", "kill", "run", "wait", "ps",
			"checkpoint", "restore", "events", "pause", "resume"}
		for _, a := range args {
			if slices.Contains(known, a) {
				return "runsc " + a
			}
		}
		return "runsc"
	case "nsenter":
		if i := slices.Index(args, "--"); i >= 0 && i+1 < len(args) {
			t := filepath.Base(args[i+1])
			if t == "runsc" || t == "hutch" || strings.HasPrefix(t, "hutch-") {
				return "nsenter → " + t
			}
			return "nsenter → " + strings.Join(args[i+1:min(len(args), i+3)], " ")
		}
		return "nsenter"
	case "sh":
		return "sh"
	}
	if len(args) > 0 && !strings.Contains(args[0], "/") {
		return name + " " + args[0]
	}
	return name
}

// shims makes a shim directory in dir for one side: a copy of this
// program, hard links to it named runsc and each of shimmed, and the
// configuration, owned by uid/gid. It returns the log path.
func makeShims(dir, runsc string, uid, gid int) (log string, err error) {
	self, err := os.Executable()
	if err != nil {
		return "", err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	bin := filepath.Join(dir, shimSelf)
	if err := copyFile(self, bin, 0o755); err != nil {
		return "", err
	}
	c := shimConfig{Log: filepath.Join(dir, "calls.log"), Real: map[string]string{"runsc": runsc}}
	for _, n := range shimmed {
		p, err := exec.LookPath(n)
		if err != nil {
			return "", fmt.Errorf("%s: %w", n, err)
		}
		c.Real[n] = p
	}
	for n := range c.Real {
		if err := os.Link(bin, filepath.Join(dir, n)); err != nil {
			return "", err
		}
	}
	b, _ := json.Marshal(c)
	if err := os.WriteFile(filepath.Join(dir, shimConf), b, 0o644); err != nil {
		return "", err
	}
	if err := os.WriteFile(c.Log, nil, 0o600); err != nil {
		return "", err
	}
	return c.Log, os.Chown(c.Log, uid, gid)
}

type shimCall struct {
	at    time.Time
	pid   int
	label string
}

// readCalls reads a shim log as the commands hutch started, in the order it
// started them. The calls of one process (nsenter that execs unshare that
// execs sleep) are one command, named by the first and the last. hutch
// starts commands one after the other, so their process IDs are in that
// order, but a command it does not wait for (a process that holds
// namespaces) may note its time after the next one has: a command's time
// is the earliest noted by it or by any command started after it.
func readCalls(path string) ([]shimCall, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var calls []shimCall
	index := map[int]int{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.SplitN(sc.Text(), " ", 3)
		var t int64
		var pid int
		if len(fields) == 3 {
			t, err = strconv.ParseInt(fields[0], 10, 64)
			if err == nil {
				pid, err = strconv.Atoi(fields[1])
			}
		}
		if len(fields) != 3 || err != nil {
			return nil, fmt.Errorf("%s: bad line %q", path, sc.Text())
		}
		label := fields[2]
		if i, ok := index[pid]; ok {
			first, _, _ := strings.Cut(calls[i].label, " … ")
			calls[i].label = first + " … " + label
			continue
		}
		index[pid] = len(calls)
		calls = append(calls, shimCall{at: time.Unix(0, t), pid: pid, label: label})
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	sort.SliceStable(calls, func(i, j int) bool { return calls[i].pid < calls[j].pid })
	for i := len(calls) - 2; i >= 0; i-- {
		if calls[i+1].at.Before(calls[i].at) {
			calls[i].at = calls[i+1].at
		}
	}
	return calls, nil
}

// phases are the parts of one kind of `hutch create`, over several runs:
// from hutch's start to its first shimmed call, from each call to the next,
// and from the last to hutch's exit.
type phases struct {
	names   []string
	samples [][]float64
	// firstRunsc is the index of the phase that starts at the first
	// runsc call, or nsenter's that runs it (len(names) if none).
	firstRunsc int
	// odd counts runs whose calls differed from the first run's.
	odd int
}

// add splits one run into phases, and reports whether its calls were
// those of the first run.
func (p *phases) add(r result, calls []shimCall) bool {
	names := []string{"hutch starts and works until its first command below"}
	times := []float64{}
	prev := r.start
	first := -1
	for _, c := range calls {
		times = append(times, c.at.Sub(prev).Seconds())
		if first < 0 && (strings.HasPrefix(c.label, "runsc") || strings.HasPrefix(c.label, "nsenter → runsc")) {
			first = len(names)
		}
		names = append(names, "`"+c.label+"`")
		prev = c.at
	}
	times = append(times, r.start.Add(r.exit).Sub(prev).Seconds())
	if first < 0 {
		first = len(names)
	}
	if p.names == nil {
		p.names, p.firstRunsc = names, first
		p.samples = make([][]float64, len(names))
	}
	if !slices.Equal(p.names, names) {
		p.odd++
		return false
	}
	for i, t := range times {
		p.samples[i] = append(p.samples[i], t)
	}
	return true
}

// median of phase i.
func (p *phases) median(i int) float64 { return summarize(p.samples[i]).median }

// sum of the medians of phases [i, j).
func (p *phases) sum(i, j int) float64 {
	t := 0.0
	for k := i; k < j && k < len(p.samples); k++ {
		t += p.median(k)
	}
	return t
}

// find is the index of the first phase whose name starts with "`"+label.
func (p *phases) find(label string) int {
	for i, n := range p.names {
		if strings.HasPrefix(n, "`"+label) {
			return i
		}
	}
	return -1
}
