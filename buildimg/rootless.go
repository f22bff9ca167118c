package buildimg

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"os/user"
	"strconv"
	"strings"
	"syscall"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"
)

// A rootless daemon (docs/decisions/0027-rootless-builds.md) runs in a
// user namespace of its own, in which the user is root and the user's
// subordinate IDs (/etc/subuid, /etc/subgid) are IDs 1 to N: images hold
// files of many owners, and gVisor's sandboxes for RUN steps run as
// "nobody" there. Only newuidmap and newgidmap (Debian's uidmap, setuid
// root) may map more than one's own ID, so the supervisor starts itself in
// new user, mount, network and PID namespaces (UsernsInit), maps them
// with those programs, and only then lets the child run buildkitd. The PID
// namespace ends every build step's sandbox with the daemon.

// UsernsInitArg, as the first argument of the hutch-buildkitd binary, runs
// UsernsInit instead of the supervisor.
const UsernsInitArg = "--userns-init"

// idRange is a block of subordinate IDs.
type idRange struct{ start, count int }

// subIDs finds u's first block of subordinate IDs in file (/etc/subuid or
// /etc/subgid), named by user name or by numeric ID.
func subIDs(file string, u *user.User, id string) (idRange, error) {
	f, err := os.Open(file)
	if err != nil {
		return idRange{}, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Split(strings.TrimSpace(sc.Text()), ":")
		if len(fields) != 3 || (fields[0] != u.Username && fields[0] != id) {
			continue
		}
		start, err1 := strconv.Atoi(fields[1])
		count, err2 := strconv.Atoi(fields[2])
		if err1 != nil || err2 != nil || start <= 0 || count <= 0 {
			continue
		}
		return idRange{start, count}, nil
	}
	if err := sc.Err(); err != nil {
		return idRange{}, err
	}
	return idRange{}, errdefs.ErrNotFound
}

// minSubIDs is the fewest subordinate IDs a rootless daemon takes: the
// IDs of a usual image (up to "nobody", 65534) must exist in its namespace.
const minSubIDs = 65536

// RootlessMissing says what this host lacks for the current unprivileged
// user to build images, each item with its fix; nil means nothing.
func RootlessMissing() []string { return rootlessMissing("/etc/subuid", "/etc/subgid") }

func rootlessMissing(subuid, subgid string) []string {
	var missing []string
	for _, p := range []string{"newuidmap", "newgidmap"} {
		if _, err := exec.LookPath(p); err != nil {
			missing = append(missing, p+" (as root: apt-get install uidmap)")
		}
	}
	u, err := user.Current()
	if err != nil {
		return append(missing, "the current user's name: "+err.Error())
	}
	for _, f := range []struct{ file, flag string }{
		{subuid, "--add-subuids"}, {subgid, "--add-subgids"},
	} {
		// Both files name the user by name or by UID.
		r, err := subIDs(f.file, u, u.Uid)
		if err != nil || r.count < minSubIDs {
			missing = append(missing, fmt.Sprintf("%d subordinate IDs for %s in %s (as root: usermod %s 100000-165535 %s, with a range no other user has)",
				minSubIDs, u.Username, f.file, f.flag, u.Username))
		}
	}
	return missing
}

// checkRootless fails with what is missing for a rootless daemon.
func checkRootless() error {
	if m := RootlessMissing(); len(m) > 0 {
		return fmt.Errorf("building images without root needs %s: %w", strings.Join(m, "; "), errdefs.ErrFailedPrecondition)
	}
	return nil
}

// rootlessCommand is the command that runs buildkitd with args in new
// namespaces: this binary (hutch-buildkitd) as UsernsInit. start starts
// it and maps its user namespace.
func rootlessCommand(self string, args []string) (cmd *exec.Cmd, start func() error, err error) {
	if err := checkRootless(); err != nil {
		return nil, nil, err
	}
	u, err := user.Current()
	if err != nil {
		return nil, nil, err
	}
	uids, err := subIDs("/etc/subuid", u, u.Uid)
	if err != nil {
		return nil, nil, err
	}
	gids, err := subIDs("/etc/subgid", u, u.Uid)
	if err != nil {
		return nil, nil, err
	}
	r, w, err := os.Pipe()
	if err != nil {
		return nil, nil, err
	}
	cmd = exec.Command(self, append([]string{UsernsInitArg, "--"}, args...)...)
	cmd.ExtraFiles = []*os.File{r}
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags: syscall.CLONE_NEWUSER | syscall.CLONE_NEWNS | syscall.CLONE_NEWNET | syscall.CLONE_NEWPID,
		Pdeathsig:  syscall.SIGKILL,
	}
	start = func() error {
		err := cmd.Start()
		r.Close()
		if err != nil {
			w.Close()
			return fmt.Errorf("start buildkitd in a user namespace: %w", err)
		}
		pid := strconv.Itoa(cmd.Process.Pid)
		for _, m := range []struct {
			prog string
			id   string
			sub  idRange
		}{{"newuidmap", u.Uid, uids}, {"newgidmap", u.Gid, gids}} {
			out, err := exec.Command(m.prog, pid, "0", m.id, "1", "1", strconv.Itoa(m.sub.start), strconv.Itoa(m.sub.count)).CombinedOutput()
			if err != nil {
				w.Close()
				_ = cmd.Process.Kill()
				_ = cmd.Wait()
				return fmt.Errorf("%s for buildkitd's user namespace: %v: %s", m.prog, err, strings.TrimSpace(string(out)))
			}
		}
		// w stays open for as long as this process lives: the child
		// sees it close when this process dies (Pdeathsig does not
		// survive the child's exec into root of its namespace).
		keepOpen = append(keepOpen, w)
		_, err = w.Write([]byte{1})
		return err
	}
	return cmd, start, nil
}

// keepOpen holds the write ends of the pipes whose end tells a rootless
// daemon's first process that its supervisor died.
var keepOpen []*os.File

// UsernsInit is the first process of a rootless daemon's namespaces (the
// hutch-buildkitd binary run with UsernsInitArg, args being "--" and
// buildkitd's command line): it waits until its parent has mapped the user
// namespace and runs itself again (its capabilities went with its exec
// before the mapping; an exec as root of the namespace gives them back).
// The second run mounts /proc for the PID namespace, runs buildkitd as
// root of the namespace, passes SIGTERM and SIGINT on to it, reaps every
// orphan (the build steps' runsc processes end up here) and exits with
// it, which ends everything else in the PID namespace.
func UsernsInit(args []string) int {
	if len(args) < 2 || (args[0] != "--" && args[0] != "--mapped") {
		fmt.Fprintln(os.Stderr, "hutch-buildkitd: usage: hutch-buildkitd", UsernsInitArg, "-- BUILDKITD [ARG]...")
		return 2
	}
	if args[0] == "--" {
		ready := os.NewFile(3, "ready")
		var b [1]byte
		if n, _ := ready.Read(b[:]); n != 1 {
			fmt.Fprintln(os.Stderr, "hutch-buildkitd: the user namespace was not mapped")
			return 1
		}
		if os.Getuid() != 0 {
			fmt.Fprintln(os.Stderr, "hutch-buildkitd: not root in the user namespace")
			return 1
		}
		self, err := os.Executable()
		if err == nil {
			err = syscall.Exec(self, append([]string{self, UsernsInitArg, "--mapped"}, args[1:]...), os.Environ())
		}
		fmt.Fprintln(os.Stderr, "hutch-buildkitd: run again in the user namespace:", err)
		return 1
	}
	args = args[1:]
	// fd 3 ends when the supervisor does: then so does everything here.
	supervisor := os.NewFile(3, "supervisor")
	unix.CloseOnExec(3)
	// The host's /proc shows the host's PIDs: runsc would write the
	// ID maps of its sandbox processes into other processes' files.
	// Mounts here do not reach the host (a namespace of a less
	// privileged user receives the host's mounts as slaves).
	if err := unix.Mount("proc", "/proc", "proc", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		fmt.Fprintln(os.Stderr, "hutch-buildkitd: mount /proc:", err)
		return 1
	}
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGCHLD)
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		fmt.Fprintln(os.Stderr, "hutch-buildkitd:", err)
		return 1
	}
	main := cmd.Process.Pid
	go func() {
		_, _ = io.Copy(io.Discard, supervisor)
		_ = cmd.Process.Kill()
		os.Exit(1)
	}()
	for s := range sigs {
		if s != syscall.SIGCHLD {
			_ = cmd.Process.Signal(s)
			continue
		}
		for {
			var ws syscall.WaitStatus
			pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
			if errors.Is(err, syscall.EINTR) {
				continue
			}
			if pid <= 0 || err != nil {
				break
			}
			if pid == main {
				if ws.Exited() {
					return ws.ExitStatus()
				}
				return 128 + int(ws.Signal())
			}
		}
	}
	return 1
}
