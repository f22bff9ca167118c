package assembly

import (
	"errors"
	"os"
	"strconv"
	"strings"
)

// The host processes sbx starts for a sandbox (runsc's, its resolver, its
// forwarder and watchdog) outlive the command that started them, so they
// are named by PID and start time: a PID the kernel has reused since is
// never taken for them.

// ProcessStart is a process's start time in clock ticks since boot: with
// its PID it names the process, so that a reused PID is never taken for
// it.
func ProcessStart(pid int) (uint64, error) {
	start, _, err := procStat(pid)
	return start, err
}

// SameProcess reports whether pid is still the live process that started
// at start.
func SameProcess(pid int, start uint64) bool {
	got, state, err := procStat(pid)
	return err == nil && got == start && state != "Z" && state != "X"
}

// procStat reads fields 3 (state) and 22 (start time) of /proc/PID/stat.
func procStat(pid int) (start uint64, state string, err error) {
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

// IsZombie reports whether pid has exited and waits to be reaped.
func IsZombie(pid int) bool {
	_, state, err := procStat(pid)
	return err == nil && state == "Z"
}
