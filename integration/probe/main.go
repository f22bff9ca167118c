// Command probe runs inside a sandbox and reports, as JSON, which
// operations it could do: "ok", or the errno name of the failure. The
// integration tests compare the report with hutch's seccomp policy. It is
// static (CGO_ENABLED=0) so that it runs on any image.
package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"runtime"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

func result(err error) string {
	if err == nil {
		return "ok"
	}
	var errno syscall.Errno
	if errors.As(err, &errno) {
		if n := unix.ErrnoName(errno); n != "" {
			return n
		}
		return fmt.Sprintf("errno %d", int(errno))
	}
	return err.Error()
}

func sys(trap uintptr, a ...uintptr) error {
	var args [6]uintptr
	copy(args[:], a)
	_, _, e := unix.Syscall6(trap, args[0], args[1], args[2], args[3], args[4], args[5])
	if e != 0 {
		return e
	}
	return nil
}

func socket(domain, typ, proto int) error {
	fd, err := unix.Socket(domain, typ, proto)
	if err == nil {
		unix.Close(fd)
	}
	return err
}

// child starts a sleeping process to be the target of ptrace and friends.
func child() (*exec.Cmd, error) {
	c := exec.Command("sleep", "30")
	return c, c.Start()
}

// listenNoAccept listens on 127.0.0.1:port with the smallest backlog and
// never accepts: once the backlog is full, a connection to it waits.
// /tmp/listening says it listens.
func listenNoAccept(port string) {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM, 0)
	if err != nil {
		panic(err)
	}
	var p int
	fmt.Sscan(port, &p)
	if err := unix.Bind(fd, &unix.SockaddrInet4{Port: p, Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		panic(err)
	}
	if err := unix.Listen(fd, 0); err != nil {
		panic(err)
	}
	if err := os.WriteFile("/tmp/listening", nil, 0o644); err != nil {
		panic(err)
	}
	for {
		// Not select {}: the runtime would end a program with no
		// goroutine that can run.
		unix.Pause()
	}
}

func main() {
	if len(os.Args) == 3 && os.Args[1] == "listen-no-accept" {
		listenNoAccept(os.Args[2])
		return
	}
	r := map[string]string{}
	run := func(name string, f func() error) { r[name] = result(f()) }

	// Denied.
	run("socket_packet", func() error { return socket(unix.AF_PACKET, unix.SOCK_RAW, 0) })
	run("socket_raw", func() error { return socket(unix.AF_INET, unix.SOCK_RAW, unix.IPPROTO_ICMP) })
	run("socket_raw6", func() error { return socket(unix.AF_INET6, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.IPPROTO_ICMPV6) })
	run("socket_vsock", func() error { return socket(unix.AF_VSOCK, unix.SOCK_STREAM, 0) })
	run("add_key", func() error {
		_, err := unix.AddKey("user", "probe", []byte("x"), unix.KEY_SPEC_PROCESS_KEYRING)
		return err
	})
	run("keyctl", func() error {
		_, err := unix.KeyctlGetKeyringID(unix.KEY_SPEC_SESSION_KEYRING, false)
		return err
	})
	run("request_key", func() error {
		_, err := unix.RequestKey("user", "probe", "", 0)
		return err
	})
	run("bpf", func() error { return sys(unix.SYS_BPF, unix.BPF_MAP_CREATE, 0, 0) })
	run("mount", func() error { return unix.Mount("tmpfs", "/mnt", "tmpfs", 0, "") })
	run("umount", func() error { return unix.Unmount("/proc", unix.MNT_DETACH) })
	run("pivot_root", func() error { return unix.PivotRoot("/", "/") })
	run("kexec_load", func() error { return sys(unix.SYS_KEXEC_LOAD, 0, 0, 0, 0) })
	run("init_module", func() error { return sys(unix.SYS_INIT_MODULE, 0, 0, 0) })
	run("delete_module", func() error { return sys(unix.SYS_DELETE_MODULE, 0, 0) })
	run("perf_event_open", func() error {
		attr := unix.PerfEventAttr{Type: unix.PERF_TYPE_SOFTWARE, Config: unix.PERF_COUNT_SW_CPU_CLOCK}
		attr.Size = uint32(unsafe.Sizeof(attr))
		fd, err := unix.PerfEventOpen(&attr, 0, -1, -1, 0)
		if err == nil {
			unix.Close(fd)
		}
		return err
	})
	run("userfaultfd", func() error { return sys(unix.SYS_USERFAULTFD, 0) })
	run("io_uring_setup", func() error {
		var params [120]byte
		return sys(unix.SYS_IO_URING_SETUP, 4, uintptr(unsafe.Pointer(&params[0])))
	})
	run("unshare_user", func() error { return unix.Unshare(unix.CLONE_NEWUSER) })
	run("unshare_net", func() error { return unix.Unshare(unix.CLONE_NEWNET) })
	run("setns", func() error {
		fd, err := unix.Open("/proc/self/ns/net", unix.O_RDONLY, 0)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		return unix.Setns(fd, unix.CLONE_NEWNET)
	})
	run("clone_newuser", func() error {
		c := exec.Command("true")
		c.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWUSER}
		return c.Run()
	})
	run("clone_newns", func() error {
		c := exec.Command("true")
		c.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNS}
		return c.Run()
	})
	runtime.LockOSThread()
	run("ptrace_attach", func() error {
		c, err := child()
		if err != nil {
			return err
		}
		defer c.Process.Kill()
		if err := unix.PtraceAttach(c.Process.Pid); err != nil {
			return err
		}
		return unix.PtraceDetach(c.Process.Pid)
	})
	run("ptrace_seize", func() error {
		c, err := child()
		if err != nil {
			return err
		}
		defer c.Process.Kill()
		if err := sys(unix.SYS_PTRACE, unix.PTRACE_SEIZE, uintptr(c.Process.Pid), 0, 0); err != nil {
			return err
		}
		return unix.PtraceDetach(c.Process.Pid)
	})
	run("process_vm_readv", func() error {
		c, err := child()
		if err != nil {
			return err
		}
		defer c.Process.Kill()
		buf := make([]byte, 8)
		local := []unix.Iovec{{Base: &buf[0], Len: 8}}
		remote := []unix.RemoteIovec{{Base: 0x400000, Len: 8}}
		_, err = unix.ProcessVMReadv(c.Process.Pid, local, remote, 0)
		return err
	})

	// Allowed.
	run("fork_exec", func() error { return exec.Command("true").Run() })
	run("ptrace_traceme_child", func() error {
		c := exec.Command("true")
		c.SysProcAttr = &syscall.SysProcAttr{Ptrace: true}
		if err := c.Start(); err != nil {
			return err
		}
		var ws unix.WaitStatus
		if _, err := unix.Wait4(c.Process.Pid, &ws, 0, nil); err != nil {
			return err
		}
		if !ws.Stopped() {
			return fmt.Errorf("child not stopped for its tracer: %v", ws)
		}
		if err := unix.PtraceCont(c.Process.Pid, 0); err != nil {
			return err
		}
		_, err := unix.Wait4(c.Process.Pid, &ws, 0, nil)
		return err
	})
	run("tcp_loopback", func() error {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return err
		}
		defer l.Close()
		go func() {
			if c, err := l.Accept(); err == nil {
				c.Write([]byte("pong"))
				c.Close()
			}
		}()
		c, err := net.Dial("tcp", l.Addr().String())
		if err != nil {
			return err
		}
		defer c.Close()
		b := make([]byte, 4)
		if _, err := c.Read(b); err != nil || string(b) != "pong" {
			return fmt.Errorf("read %q: %v", b, err)
		}
		return nil
	})
	run("udp_socket", func() error { return socket(unix.AF_INET, unix.SOCK_DGRAM, 0) })
	run("unix_socketpair", func() error {
		fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM, 0)
		if err == nil {
			unix.Close(fds[0])
			unix.Close(fds[1])
		}
		return err
	})
	run("netlink_route", func() error { _, err := net.Interfaces(); return err })
	run("file_io", func() error {
		f, err := os.CreateTemp("", "probe-")
		if err != nil {
			return err
		}
		defer os.Remove(f.Name())
		if _, err := f.Write([]byte("data")); err != nil {
			return err
		}
		f.Close()
		b, err := os.ReadFile(f.Name())
		if err == nil && string(b) != "data" {
			err = fmt.Errorf("read back %q", b)
		}
		return err
	})
	run("chroot", func() error { return unix.Chroot("/") })

	json.NewEncoder(os.Stdout).Encode(r)
}
