package agent

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"hutch.dev/hutch/agent/wire"
)

// The agent's side of a rootless sandbox's owners list (see
// wire.OwnersPath): apply-owners sets the owners it lists inside the
// sandbox.

func init() { subcommands[wire.CmdApplyOwners] = applyOwnersMain }

func applyOwnersMain(args []string) int {
	uid, gid := -1, -1
	if len(args) >= 2 && args[0] == "--user" {
		u, g, ok := strings.Cut(args[1], ":")
		var err1, err2 error
		uid, err1 = strconv.Atoi(u)
		gid, err2 = strconv.Atoi(g)
		if !ok || err1 != nil || err2 != nil || uid < 0 || gid < 0 {
			fmt.Fprintln(os.Stderr, "hutch-init: apply-owners: --user UID:GID")
			return 2
		}
		args = args[2:]
	}
	if len(args) > 0 && (args[0] != "--" || len(args) < 2) || uid >= 0 && len(args) == 0 {
		fmt.Fprintln(os.Stderr, "usage: hutch-init apply-owners [--user UID:GID] [-- CMD [ARG...]]")
		return 2
	}
	f, err := os.Open(wire.OwnersPath)
	if err != nil {
		fmt.Fprintf(os.Stderr, "hutch-init: apply-owners: %v\n", errnoOf(err))
		return 1
	}
	// Before a command, what is skipped is no concern of its output.
	var warn io.Writer = os.Stderr
	if len(args) > 0 {
		warn = io.Discard
	}
	mounts, err := mountPoints("/proc/self/mountinfo")
	if err == nil {
		err = ApplyOwners("/", f, mounts, warn)
	}
	f.Close()
	if err != nil {
		fmt.Fprintf(os.Stderr, "hutch-init: apply-owners: %v\n", err)
		return 1
	}
	if len(args) == 0 {
		return 0
	}
	return execAs(uid, gid, args[1:])
}

// ApplyOwners sets, below root, the owner and mode of every entry the list
// r names. A path is resolved inside root component by component without
// following a symbolic link; one with "..", a symbolic link on its way, or
// at or below a path in mounts (the sandbox's other mounts: /proc, volumes)
// is skipped with a note on warn, as is one that does not exist. The entry
// itself, a symbolic link included, is changed, never what it points to.
func ApplyOwners(root string, r io.Reader, mounts []string, warn io.Writer) error {
	rootFd, err := unix.Open(root, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return &os.PathError{Op: "open", Path: root, Err: err}
	}
	defer unix.Close(rootFd)
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for n := 1; sc.Scan(); n++ {
		uid, gid, mode, p, err := parseOwnerLine(sc.Text())
		if err != nil {
			return fmt.Errorf("%s line %d: %w", wire.OwnersPath, n, err)
		}
		if why := ownerPathRefused(p, mounts); why != "" {
			fmt.Fprintf(warn, "hutch-init: apply-owners: %q skipped: %s\n", p, why)
			continue
		}
		switch err := applyOwner(rootFd, p, uid, gid, mode); {
		case err == nil:
		case errors.Is(err, unix.ENOENT), errors.Is(err, unix.ENOTDIR), errors.Is(err, unix.ELOOP):
			fmt.Fprintf(warn, "hutch-init: apply-owners: %q skipped: %v\n", p, err)
		default:
			return fmt.Errorf("%s: %w", p, err)
		}
	}
	return sc.Err()
}

func parseOwnerLine(line string) (uid, gid int, mode uint32, p string, err error) {
	f := strings.SplitN(line, " ", 4)
	if len(f) != 4 {
		return 0, 0, 0, "", errors.New("want UID GID MODE PATH")
	}
	u, err1 := strconv.ParseUint(f[0], 10, 32)
	g, err2 := strconv.ParseUint(f[1], 10, 32)
	m, err3 := strconv.ParseUint(f[2], 8, 32)
	p, err4 := strconv.Unquote(f[3])
	if err := errors.Join(err1, err2, err3, err4); err != nil || m&^0o7777 != 0 {
		return 0, 0, 0, "", fmt.Errorf("want UID GID MODE PATH: %q", line)
	}
	return int(u), int(g), uint32(m), p, nil
}

// ownerPathRefused says why p may not be changed, or "".
func ownerPathRefused(p string, mounts []string) string {
	if !strings.HasPrefix(p, "/") || p == "/" || strings.ContainsRune(p, 0) {
		return "not a path below /"
	}
	for _, c := range strings.Split(p[1:], "/") {
		if c == "" || c == "." || c == ".." {
			return "not a clean path"
		}
	}
	for _, m := range mounts {
		if m != "/" && (p == m || strings.HasPrefix(p, m+"/")) {
			return "on the mount " + m
		}
	}
	return ""
}

// applyOwner walks p's directories from rootFd without following links and
// changes p's final component there.
func applyOwner(rootFd int, p string, uid, gid int, mode uint32) error {
	dir, base := path.Split(p)
	fd, err := unix.Dup(rootFd)
	if err != nil {
		return err
	}
	defer func() { unix.Close(fd) }()
	for _, c := range strings.Split(strings.Trim(dir, "/"), "/") {
		if c == "" {
			continue
		}
		next, err := unix.Openat(fd, c, unix.O_PATH|unix.O_NOFOLLOW|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			return err // ENOTDIR or ELOOP: a link on the way
		}
		unix.Close(fd)
		fd = next
	}
	var st unix.Stat_t
	if err := unix.Fstatat(fd, base, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return err
	}
	if err := unix.Fchownat(fd, base, uid, gid, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return err
	}
	if st.Mode&unix.S_IFMT == unix.S_IFLNK {
		return nil
	}
	// Not a link, and nothing else runs yet to make it one.
	return unix.Fchmodat(fd, base, mode, 0)
}

// mountPoints lists the mount points of mountinfo.
func mountPoints(mountinfo string) ([]string, error) {
	b, err := os.ReadFile(mountinfo)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 5 {
			continue
		}
		out = append(out, path.Clean(unescapeMountinfo(f[4])))
	}
	return out, nil
}

// unescapeMountinfo undoes the octal escapes (\040) of a mountinfo field.
func unescapeMountinfo(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// execAs becomes args[0], run as uid:gid when uid is not -1. A command
// that cannot run gets the shell's status and hutch's message, as when
// runsc starts it itself.
func execAs(uid, gid int, args []string) int {
	if uid >= 0 {
		if st := becomeUser(uid, gid); st != 0 {
			return st
		}
	}
	switch LookPath(args[0]) {
	case wire.StatusNotFound:
		fmt.Fprintf(os.Stderr, "hutch: %s: command not found\n", args[0])
		return wire.StatusNotFound
	case wire.StatusNotExecutable:
		fmt.Fprintf(os.Stderr, "hutch: %s: permission denied\n", args[0])
		return wire.StatusNotExecutable
	}
	p := args[0]
	if !strings.Contains(p, "/") {
		var err error
		if p, err = exec.LookPath(args[0]); err != nil {
			return wire.StatusNotFound
		}
	}
	err := syscall.Exec(p, args, os.Environ())
	fmt.Fprintf(os.Stderr, "hutch-init: exec %s: %v\n", args[0], err)
	return wire.StatusNotExecutable
}
