package agent

import (
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"hutch.dev/hutch/agent/wire"
)

func init() {
	subcommands[wire.ModeMv] = mvMain
}

// newFlags is the option parser of a file subcommand: options come
// before "--" and the operands, and errors are the caller's to report.
func newFlags(name string) *flag.FlagSet {
	fl := flag.NewFlagSet(name, flag.ContinueOnError)
	fl.SetOutput(io.Discard)
	return fl
}

// ownerFlag is the -o UID:GID option: who owns what a subcommand creates.
type ownerFlag struct {
	set      bool
	uid, gid uint32
}

func (o *ownerFlag) String() string {
	if !o.set {
		return ""
	}
	return fmt.Sprintf("%d:%d", o.uid, o.gid)
}

func (o *ownerFlag) Set(v string) error {
	u, g, ok := strings.Cut(v, ":")
	uid, err1 := strconv.ParseUint(u, 10, 32)
	gid, err2 := strconv.ParseUint(g, 10, 32)
	if !ok || err1 != nil || err2 != nil {
		return fmt.Errorf("owner %q: want UID:GID", v)
	}
	o.set, o.uid, o.gid = true, uint32(uid), uint32(gid)
	return nil
}

// mkdirOwned creates dir and its missing parents with perm, each owned by
// owner when it is set. An existing directory is no error; an existing
// non-directory is ENOTDIR.
func mkdirOwned(dir string, perm fs.FileMode, owner ownerFlag) error {
	fi, err := os.Stat(dir)
	switch {
	case err == nil && fi.IsDir():
		return nil
	case err == nil:
		return &fs.PathError{Op: "mkdir", Path: dir, Err: syscall.ENOTDIR}
	case !os.IsNotExist(err):
		return err
	}
	if parent := filepath.Dir(dir); parent != dir {
		if err := mkdirOwned(parent, perm, owner); err != nil {
			return err
		}
	}
	if err := os.Mkdir(dir, perm); err != nil {
		if os.IsExist(err) {
			return nil // made meanwhile
		}
		return err
	}
	if owner.set {
		return os.Lchown(dir, int(owner.uid), int(owner.gid))
	}
	return nil
}

// listDir appends the entries of dir, and of its subdirectories down to
// depth levels, to out.
func listDir(dir string, depth uint, out *[]wire.FileInfo) error {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, ent := range ents {
		fi, err := ent.Info()
		if err != nil {
			continue // removed meanwhile
		}
		p := filepath.Join(dir, ent.Name())
		*out = append(*out, fileInfo(p, fi))
		if depth > 1 && ent.IsDir() {
			if err := listDir(p, depth-1, out); err != nil && !os.IsNotExist(err) && !os.IsPermission(err) {
				return err
			}
		}
	}
	return nil
}

// names caches the user and group names of IDs for one run of the agent.
var names = struct{ users, groups map[uint32]string }{map[uint32]string{}, map[uint32]string{}}

// ownerNames names uid and gid from the sandbox's /etc/passwd and
// /etc/group; an ID without an entry has no name.
func ownerNames(uid, gid uint32) (owner, group string) {
	owner, ok := names.users[uid]
	if !ok {
		if u, err := user.LookupId(strconv.FormatUint(uint64(uid), 10)); err == nil {
			owner = u.Username
		}
		names.users[uid] = owner
	}
	group, ok = names.groups[gid]
	if !ok {
		if g, err := user.LookupGroupId(strconv.FormatUint(uint64(gid), 10)); err == nil {
			group = g.Name
		}
		names.groups[gid] = group
	}
	return owner, group
}

// mvMain is "mv [-o UID:GID] [--] SRC DST": renames SRC to DST, creating
// DST's missing parent directories (owned by UID:GID with -o). An
// existing file at DST is replaced, as rename(2) does.
func mvMain(args []string) int {
	fl := newFlags("mv")
	var owner ownerFlag
	fl.Var(&owner, "o", "owner UID:GID")
	if fl.Parse(args) != nil || fl.NArg() != 2 {
		return usage("mv [-o UID:GID] SRC DST")
	}
	src, dst := fl.Arg(0), fl.Arg(1)
	if _, err := os.Lstat(src); err != nil {
		return fail(err)
	}
	if err := mkdirOwned(filepath.Dir(dst), 0o755, owner); err != nil {
		return fail(err)
	}
	if err := os.Rename(src, dst); err != nil {
		return fail(err)
	}
	return 0
}
