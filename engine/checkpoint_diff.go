package engine

import (
	"archive/tar"
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"sort"
	"strings"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"

	"hutch.dev/hutch/engine/workspace"
	"hutch.dev/hutch/overlay"
)

// ChangeRenamed is a file that moved: Path is where it is, From where it
// was, with the same content.
const ChangeRenamed = "R"

// CheckpointChange is one path that differs between two states of a
// sandbox's files (two checkpoints, or one and the sandbox now), as `hutch
// diff` reports a workspace's: A added, M changed (content, type, mode or
// target), D deleted, R renamed (From is the old path).
type CheckpointChange struct {
	workspace.Change
	From string `json:"from,omitempty"`
}

// CheckpointLive, as the second checkpoint of DiffCheckpoints, names the
// sandbox's files now.
const CheckpointLive = "live"

// DiffCheckpoints lists what changed in sandbox ref's files from
// checkpoint a to checkpoint b (CheckpointLive: the running sandbox now),
// sorted by path. Paths hutch never captures (/run, /.hutch) are not
// compared.
func (e *Engine) DiffCheckpoints(ctx context.Context, ref, a, b string) ([]CheckpointChange, error) {
	if err := ValidCheckpointID(a); err != nil {
		return nil, err
	}
	if b != CheckpointLive {
		if err := ValidCheckpointID(b); err != nil {
			return nil, err
		}
	}
	sb, unlock, err := e.getLocked(ctx, ref)
	if err != nil {
		return nil, err
	}
	defer unlock()
	ia, err := e.readCheckpointInfo(sb, a)
	if err != nil {
		return nil, err
	}
	la, err := e.checkpointFiles(ctx, ia)
	if err != nil {
		return nil, err
	}
	var lb *stateLayer
	if b == CheckpointLive {
		if sb.State != StateRunning {
			return nil, fmt.Errorf("sandbox %s is %s: its files now can be compared while it runs: %w", sb.ShortID(), sb.State, errdefs.ErrFailedPrecondition)
		}
		if lb, err = e.liveFiles(ctx, sb); err != nil {
			return nil, err
		}
	} else {
		ib, err := e.readCheckpointInfo(sb, b)
		if err != nil {
			return nil, err
		}
		if lb, err = e.checkpointFiles(ctx, ib); err != nil {
			return nil, err
		}
	}
	base, err := openBase(sb.Rootfs)
	if err != nil {
		return nil, err
	}
	defer base.close()
	return diffStates(la, lb, base)
}

// checkpointFiles reads the files layer of checkpoint info.
func (e *Engine) checkpointFiles(ctx context.Context, info CheckpointInfo) (*stateLayer, error) {
	r, err := e.images.OpenCheckpointFiles(ctx, info.Memory)
	if err != nil {
		return nil, fmt.Errorf("checkpoint %s: its files: %w", info.ID, err)
	}
	defer r.Close()
	l, err := readStateLayer(r)
	if err != nil {
		return nil, fmt.Errorf("checkpoint %s: its files: %w", info.ID, err)
	}
	return l, nil
}

// liveFiles reads running sandbox sb's changes to its image now.
func (e *Engine) liveFiles(ctx context.Context, sb *record) (*stateLayer, error) {
	x, err := e.startUpperExport(ctx, sb)
	if err != nil {
		return nil, err
	}
	pr, pw := io.Pipe()
	conv := make(chan error, 1)
	go func() {
		err := overlay.UpperLayer(pw, bufio.NewReaderSize(x.r, upperBufSize), snapshotExclude)
		pw.CloseWithError(err)
		conv <- err
	}()
	l, err := readStateLayer(pr)
	if err == nil {
		_, err = io.Copy(io.Discard, pr) // the end of the archive
	}
	pr.CloseWithError(errors.New("diff: stopped reading"))
	if err != nil {
		x.close() //nolint:errcheck // err says more
		<-conv
		return nil, fmt.Errorf("diff: the sandbox's files now: %w", err)
	}
	err = <-conv
	if werr := x.wait(); werr != nil && err == nil {
		err = werr
	}
	if xerr := x.close(); xerr != nil && err == nil {
		err = xerr
	}
	if err != nil {
		return nil, fmt.Errorf("diff: the sandbox's files now: %w", err)
	}
	return l, nil
}

// fileState is one path of a state of the files.
type fileState struct {
	typ  string // file, dir, symlink, other
	mode fs.FileMode
	size int64
	link string
	sum  string // regular files: SHA-256 of the content
}

func (a fileState) same(b fileState) bool {
	return a.typ == b.typ && a.mode == b.mode && a.link == b.link && a.sum == b.sum
}

// stateLayer is a layer of changes to an image: entries, deletions
// (whiteouts) and directories whose image contents it hides (opaque).
type stateLayer struct {
	entries map[string]fileState
	deleted map[string]bool
	opaque  map[string]bool
}

func (l *stateLayer) exclude(p string) {
	for k := range l.entries {
		if k == p || strings.HasPrefix(k, p+"/") {
			delete(l.entries, k)
		}
	}
	for k := range l.deleted {
		if k == p || strings.HasPrefix(k, p+"/") {
			delete(l.deleted, k)
		}
	}
	delete(l.opaque, p)
}

// readStateLayer indexes an uncompressed layer tar (runsc's export, or a
// stored snapshot layer): OCI whiteouts, opaque markers, hard links as
// the file they name.
func readStateLayer(r io.Reader) (*stateLayer, error) {
	l := &stateLayer{entries: map[string]fileState{}, deleted: map[string]bool{}, opaque: map[string]bool{}}
	tr := tar.NewReader(r)
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			return l, nil
		}
		if err != nil {
			return nil, fmt.Errorf("read a layer: %w", err)
		}
		name := strings.Trim(path.Clean("/"+hdr.Name), "/")
		if name == "" {
			continue
		}
		dir, base := path.Split(name)
		dir = strings.TrimSuffix(dir, "/")
		if base == ".wh..wh..opq" {
			l.opaque[dir] = true
			continue
		}
		if w, ok := strings.CutPrefix(base, ".wh."); ok {
			l.deleted[path.Join(dir, w)] = true
			continue
		}
		st := fileState{mode: hdr.FileInfo().Mode() & (fs.ModePerm | fs.ModeSetuid | fs.ModeSetgid | fs.ModeSticky)}
		switch hdr.Typeflag {
		case tar.TypeReg:
			st.typ, st.size = "file", hdr.Size
			h := sha256.New()
			if _, err := io.Copy(h, tr); err != nil {
				return nil, fmt.Errorf("read a layer: %s: %w", name, err)
			}
			st.sum = hex.EncodeToString(h.Sum(nil))
		case tar.TypeLink:
			t, ok := l.entries[strings.Trim(path.Clean("/"+hdr.Linkname), "/")]
			if !ok {
				return nil, fmt.Errorf("read a layer: hard link %s to %s, not before it", name, hdr.Linkname)
			}
			st = t
		case tar.TypeDir:
			st.typ = "dir"
		case tar.TypeSymlink:
			st.typ, st.link = "symlink", hdr.Linkname
		default:
			st.typ = "other"
		}
		l.entries[name] = st
	}
}

// hidden reports whether layer l hides the image's p: p or a directory
// above it deleted, replaced, or made opaque by l.
func (l *stateLayer) hidden(p string) bool {
	if l.deleted[p] {
		return true
	}
	for d := path.Dir(p); ; d = path.Dir(d) {
		if d == "." {
			d = ""
		}
		if l.deleted[d] || l.opaque[d] {
			return true
		}
		if e, ok := l.entries[d]; ok && e.typ != "dir" {
			return true
		}
		if d == "" {
			return false
		}
	}
}

// baseFS is an image's root filesystem, read without following any
// symlink in it.
type baseFS struct{ root int }

func openBase(dir string) (*baseFS, error) {
	fd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: dir, Err: err}
	}
	return &baseFS{root: fd}, nil
}

func (b *baseFS) close() { unix.Close(b.root) }

func (b *baseFS) open(rel string, flags int) (int, error) {
	if rel == "" {
		rel = "."
	}
	return unix.Openat2(b.root, rel, &unix.OpenHow{
		Flags:   uint64(flags | unix.O_CLOEXEC | unix.O_NOFOLLOW),
		Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS,
	})
}

// stat is the image's p, or false if it has none (a symlink on the way
// counts as none).
func (b *baseFS) stat(p string) (fileState, bool, error) {
	dir, name := path.Split(p)
	d, err := b.open(strings.TrimSuffix(dir, "/"), unix.O_PATH|unix.O_DIRECTORY)
	if err != nil {
		if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ELOOP) || errors.Is(err, unix.ENOTDIR) {
			return fileState{}, false, nil
		}
		return fileState{}, false, err
	}
	defer unix.Close(d)
	var st unix.Stat_t
	if err := unix.Fstatat(d, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return fileState{}, false, nil
		}
		return fileState{}, false, err
	}
	fst := fileState{mode: fs.FileMode(st.Mode & 0o777)}
	if st.Mode&unix.S_ISUID != 0 {
		fst.mode |= fs.ModeSetuid
	}
	if st.Mode&unix.S_ISGID != 0 {
		fst.mode |= fs.ModeSetgid
	}
	if st.Mode&unix.S_ISVTX != 0 {
		fst.mode |= fs.ModeSticky
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFREG:
		fst.typ, fst.size = "file", st.Size
	case unix.S_IFDIR:
		fst.typ = "dir"
	case unix.S_IFLNK:
		fst.typ = "symlink"
		buf := make([]byte, unix.PathMax)
		n, err := unix.Readlinkat(d, name, buf)
		if err != nil {
			return fileState{}, false, err
		}
		fst.link = string(buf[:n])
	default:
		fst.typ = "other"
	}
	return fst, true, nil
}

// sum is the SHA-256 of the image's regular file p.
func (b *baseFS) sum(p string) (string, error) {
	fd, err := b.open(p, unix.O_RDONLY)
	if err != nil {
		return "", err
	}
	f := os.NewFile(uintptr(fd), p)
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// below lists the image's paths strictly below directory p.
func (b *baseFS) below(p string) ([]string, error) {
	fd, err := b.open(p, unix.O_RDONLY|unix.O_DIRECTORY)
	if err != nil {
		if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ELOOP) || errors.Is(err, unix.ENOTDIR) {
			return nil, nil
		}
		return nil, err
	}
	f := os.NewFile(uintptr(fd), p)
	names, err := f.Readdirnames(-1)
	f.Close()
	if err != nil {
		return nil, err
	}
	var out []string
	for _, n := range names {
		c := path.Join(p, n)
		out = append(out, c)
		var st unix.Stat_t
		if unix.Fstatat(b.root, c, &st, unix.AT_SYMLINK_NOFOLLOW) == nil && st.Mode&unix.S_IFMT == unix.S_IFDIR {
			sub, err := b.below(c)
			if err != nil {
				return nil, err
			}
			out = append(out, sub...)
		}
	}
	return out, nil
}

// maxDiffPaths bounds the paths one diff compares.
const maxDiffPaths = 1 << 20

// diffStates compares the files of two layers over the same image.
func diffStates(a, b *stateLayer, base *baseFS) ([]CheckpointChange, error) {
	paths := map[string]bool{}
	var hiding []string
	for _, l := range []*stateLayer{a, b} {
		for p := range l.entries {
			paths[p] = true
		}
		for p := range l.deleted {
			paths[p] = true
			hiding = append(hiding, p)
		}
		for p := range l.opaque {
			hiding = append(hiding, p)
		}
		for p, e := range l.entries {
			if e.typ != "dir" {
				hiding = append(hiding, p) // a directory of the image replaced
			}
		}
	}
	for _, p := range hiding {
		sub, err := base.below(p)
		if err != nil {
			return nil, err
		}
		for _, s := range sub {
			paths[s] = true
		}
		if len(paths) > maxDiffPaths {
			return nil, fmt.Errorf("diff: more than %d paths to compare: %w", maxDiffPaths, errdefs.ErrFailedPrecondition)
		}
	}
	sums := map[string]string{}
	resolve := func(l *stateLayer, p string) (fileState, bool, error) {
		if e, ok := l.entries[p]; ok {
			return e, true, nil
		}
		if l.hidden(p) {
			return fileState{}, false, nil
		}
		st, ok, err := base.stat(p)
		if err != nil || !ok || st.typ != "file" {
			return st, ok, err
		}
		if s, ok := sums[p]; ok {
			st.sum = s
			return st, true, nil
		}
		if st.sum, err = base.sum(p); err != nil {
			return fileState{}, false, err
		}
		sums[p] = st.sum
		return st, true, nil
	}
	sorted := make([]string, 0, len(paths))
	for p := range paths {
		sorted = append(sorted, p)
	}
	sort.Strings(sorted)
	var out []CheckpointChange
	for _, p := range sorted {
		_, ina := a.entries[p]
		_, inb := b.entries[p]
		if !ina && !inb && !a.hidden(p) && !b.hidden(p) {
			continue // the image's in both
		}
		sa, oka, err := resolve(a, p)
		if err != nil {
			return nil, err
		}
		sbst, okb, err := resolve(b, p)
		if err != nil {
			return nil, err
		}
		c := CheckpointChange{Change: workspace.Change{Path: "/" + p}}
		switch {
		case !oka && !okb:
			continue
		case !oka:
			c.Kind, c.Type, c.Mode, c.Link = workspace.ChangeAdded, sbst.typ, sbst.mode, sbst.link
		case !okb:
			c.Kind, c.Type, c.Mode, c.Link = workspace.ChangeDeleted, sa.typ, sa.mode, sa.link
		case sa.same(sbst):
			continue
		case sa.typ == "dir" && sbst.typ == "dir" && sa.mode == sbst.mode:
			continue
		default:
			c.Kind, c.Type, c.Mode, c.OldMode, c.Link = workspace.ChangeModified, sbst.typ, sbst.mode, sa.mode, sbst.link
		}
		if c.Type == "file" {
			if c.Kind == workspace.ChangeDeleted {
				c.From = sa.sum // matched to an addition below
			} else if c.Kind == workspace.ChangeAdded {
				c.From = sbst.sum
			}
		}
		out = append(out, c)
	}
	return pairRenames(out), nil
}

// pairRenames turns a deleted file and an added one with the same content
// into one rename; From holds the content's sum on entry.
func pairRenames(in []CheckpointChange) []CheckpointChange {
	deleted := map[string][]int{}
	for i, c := range in {
		if c.Kind == workspace.ChangeDeleted && c.From != "" {
			deleted[c.From] = append(deleted[c.From], i)
		}
	}
	drop := map[int]bool{}
	for i := range in {
		c := &in[i]
		if c.Kind != workspace.ChangeAdded || c.From == "" {
			continue
		}
		sum := c.From
		c.From = ""
		if ds := deleted[sum]; len(ds) > 0 {
			d := ds[0]
			deleted[sum] = ds[1:]
			drop[d] = true
			c.Kind, c.From = ChangeRenamed, in[d].Path
			if in[d].Mode != c.Mode {
				c.OldMode = in[d].Mode
			}
		}
	}
	var out []CheckpointChange
	for i, c := range in {
		if drop[i] {
			continue
		}
		if c.Kind == workspace.ChangeDeleted {
			c.From = ""
		}
		out = append(out, c)
	}
	return out
}
