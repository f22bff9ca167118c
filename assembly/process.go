package assembly

import "hutch.dev/hutch/assembly/hostproc"

// The host processes hutch starts for a sandbox (runsc's, its resolver, its
// forwarder and watchdog) outlive the command that started them, so they
// are named by PID and start time: a PID the kernel has reused since is
// never taken for them.

// ProcessStart is a process's start time in clock ticks since boot: with
// its PID it names the process, so that a reused PID is never taken for
// it.
func ProcessStart(pid int) (uint64, error) { return hostproc.Start(pid) }

// SameProcess reports whether pid is still the live process that started
// at start.
func SameProcess(pid int, start uint64) bool { return hostproc.Same(pid, start) }

// IsZombie reports whether pid has exited and waits to be reaped.
func IsZombie(pid int) bool { return hostproc.Zombie(pid) }
