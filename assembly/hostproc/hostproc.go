// Package hostproc names host processes by PID and start time, so that a
// PID the kernel has reused is never taken for the process hutch started.
// It reads /proc only, and imports nothing else of hutch, so that the small
// helper binary (cmd/hutch-helper) can use it too.
package hostproc

import (
	"errors"
	"os"
	"strconv"
	"strings"
)

// Start is a process's start time in clock ticks since boot: with its PID
// it names the process.
func Start(pid int) (uint64, error) {
	start, _, err := stat(pid)
	return start, err
}

// Same reports whether pid is still the live process that started at
// start.
func Same(pid int, start uint64) bool {
	got, state, err := stat(pid)
	return err == nil && got == start && state != "Z" && state != "X"
}

// Zombie reports whether pid has exited and waits to be reaped.
func Zombie(pid int) bool {
	_, state, err := stat(pid)
	return err == nil && state == "Z"
}

// stat reads fields 3 (state) and 22 (start time) of /proc/PID/stat.
func stat(pid int) (start uint64, state string, err error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, "", err
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, "", errors.New("bad /proc/" + strconv.Itoa(pid) + "/stat")
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 20 {
		return 0, "", errors.New("bad /proc/" + strconv.Itoa(pid) + "/stat")
	}
	start, err = strconv.ParseUint(f[19], 10, 64)
	return start, f[0], err
}
