// Package benchcmd holds what the benchmark programs do alike: time a
// command to its first output, read a hutch sandbox's runsc flags for raw
// runsc to reuse, and summarize durations.
package benchcmd

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"
)

// FirstOutput runs c and returns the time from just before its start to
// the first line of its stdout, which must be want; it waits for c.
func FirstOutput(c *exec.Cmd, want string) (time.Duration, error) {
	out, err := c.StdoutPipe()
	if err != nil {
		return 0, err
	}
	c.Stderr = os.Stderr
	start := time.Now()
	if err := c.Start(); err != nil {
		return 0, err
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	d := time.Since(start)
	io.Copy(io.Discard, out) //nolint:errcheck // drained
	if werr := c.Wait(); err != nil || werr != nil || strings.TrimSpace(line) != want {
		return d, fmt.Errorf("%s: printed %q (%v, %v), want %q", strings.Join(c.Args, " "), line, err, werr, want)
	}
	return d, nil
}

// RunscGlobals are the runsc global flags hutch runs sandbox id of state
// root with: those of its sandbox process, before "boot".
func RunscGlobals(root, id string) ([]string, error) {
	pb, err := os.ReadFile(filepath.Join(root, "sandboxes", id, "sandbox.pid"))
	if err != nil {
		return nil, err
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(pb)))
	if err != nil {
		return nil, err
	}
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

// Median is the median of v (the upper one of an even count); 0 for none.
func Median(v []time.Duration) time.Duration {
	if len(v) == 0 {
		return 0
	}
	s := append([]time.Duration(nil), v...)
	sort.Slice(s, func(a, b int) bool { return s[a] < s[b] })
	return s[len(s)/2]
}

// Ms is d in milliseconds, to a tenth.
func Ms(d time.Duration) string { return fmt.Sprintf("%.1f ms", float64(d.Microseconds())/1000) }

// CopyBundle writes a copy of a sandbox's bundle (its config.json) from
// directory src to dst, for raw runsc's container id, with a cgroup of
// its own under /hutch-bench. It returns dst.
func CopyBundle(src, dst, id string) (string, error) {
	raw, err := os.ReadFile(filepath.Join(src, "config.json"))
	if err != nil {
		return "", err
	}
	var spec map[string]any
	if err := json.Unmarshal(raw, &spec); err != nil {
		return "", fmt.Errorf("%s: %w", filepath.Join(src, "config.json"), err)
	}
	if linux, ok := spec["linux"].(map[string]any); ok {
		if _, ok := linux["cgroupsPath"]; ok {
			linux["cgroupsPath"] = "/hutch-bench/" + id
		}
	}
	out, err := json.Marshal(spec)
	if err != nil {
		return "", err
	}
	if err := os.MkdirAll(dst, 0o700); err != nil {
		return "", err
	}
	return dst, os.WriteFile(filepath.Join(dst, "config.json"), out, 0o600)
}
