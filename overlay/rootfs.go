package overlay

import (
	"archive/tar"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/containerd/containerd/v2/core/content"
	"github.com/containerd/containerd/v2/pkg/archive"
	"github.com/containerd/containerd/v2/pkg/archive/compression"
	cfs "github.com/containerd/continuity/fs"
	"github.com/containerd/continuity/sysx"
	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	"github.com/opencontainers/go-digest"
	"github.com/opencontainers/image-spec/identity"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"golang.org/x/sys/unix"
)

// Rootfs returns the path of img's flattened root filesystem, unpacking it
// first if needed, and records the lease leaseID on it.
//
// The directory R/rootfs/<chain ID> holds every layer of img applied in
// order, OCI whiteouts and opaque directories resolved. It appears only
// complete: each layer chain is built in a temporary directory, from a hard
// link copy of its parent chain plus one layer, and renamed into place, so
// concurrent callers (goroutines or processes) for the same image all get the
// one complete directory. Every layer is checked against its descriptor's
// digest and its config diff_id while it is applied; a mismatch wraps
// ErrCorrupt and leaves no directory for that chain.
//
// The directory and every file in it are shared with other sandboxes and with
// child chains through hard links: callers must treat it as read-only.
//
// A lease keeps the chain through Remove and Prune until Release. leaseID is
// a sandbox ID (^[a-zA-Z0-9][a-zA-Z0-9_.-]{0,127}$); recording the same lease
// again is a no-op, and recording it for another image moves it. When not
// running as root, file ownership in layers is not preserved (files belong to
// the caller; OwnersFile lists the owners the layers give) and device nodes
// are skipped.
func (s *Store) Rootfs(ctx context.Context, img Image, leaseID string) (string, error) {
	if err := validLeaseID(leaseID); err != nil {
		return "", err
	}
	diffIDs := img.Config.RootFS.DiffIDs
	if len(img.Layers) == 0 {
		return "", fmt.Errorf("image %q has no layers: %w", img.Name, errdefs.ErrFailedPrecondition)
	}
	if len(diffIDs) != len(img.Layers) {
		return "", fmt.Errorf("image %q: %d layers but %d diff_ids: %w", img.Name, len(img.Layers), len(diffIDs), errdefs.ErrFailedPrecondition)
	}
	chainIDs := identity.ChainIDs(append([]digest.Digest(nil), diffIDs...))
	if img.ChainID != "" && img.ChainID != chainIDs[len(chainIDs)-1] {
		return "", fmt.Errorf("image %q: chain ID %s does not match its diff_ids: %w", img.Name, img.ChainID, errdefs.ErrInvalidArgument)
	}

	gc, err := lockPath(s.gcLockPath(), unix.LOCK_SH)
	if err != nil {
		return "", err
	}
	defer gc.Unlock()

	p, err := s.ensureChain(ctx, img, chainIDs, len(chainIDs))
	if err != nil {
		return "", err
	}
	lease := []byte(chainIDs[len(chainIDs)-1].Encoded() + "\n")
	if cur, err := os.ReadFile(filepath.Join(s.leaseDir(), leaseID)); err == nil && string(cur) == string(lease) {
		return p, nil
	}
	if err := writeFileAtomic(filepath.Join(s.leaseDir(), leaseID), lease, 0o600); err != nil {
		return "", fmt.Errorf("record lease %s: %w", leaseID, err)
	}
	return p, nil
}

// Release drops the lease leaseID. A lease that does not exist is not an
// error. The rootfs it kept is collected by the next Remove or Prune.
func (s *Store) Release(ctx context.Context, leaseID string) error {
	if err := validLeaseID(leaseID); err != nil {
		return err
	}
	if err := os.Remove(filepath.Join(s.leaseDir(), leaseID)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("release lease %s: %w", leaseID, err)
	}
	return nil
}

func (s *Store) chainPath(id digest.Digest) string {
	return filepath.Join(s.rootfsDir(), id.Encoded())
}

// ensureChain makes sure the chain of img's first n layers is unpacked and
// returns its path. The caller holds the gc lock shared.
func (s *Store) ensureChain(ctx context.Context, img Image, chainIDs []digest.Digest, n int) (string, error) {
	final := s.chainPath(chainIDs[n-1])
	if _, err := os.Lstat(final); err == nil {
		return final, nil
	}
	l, err := lockPath(filepath.Join(s.lockDir(), "chain-"+chainIDs[n-1].Encoded()), unix.LOCK_EX)
	if err != nil {
		return "", err
	}
	defer l.Unlock()
	if _, err := os.Lstat(final); err == nil {
		return final, nil // built by someone else while we waited
	}
	parent := ""
	if n > 1 {
		if parent, err = s.ensureChain(ctx, img, chainIDs, n-1); err != nil {
			return "", err
		}
	}

	tmp, err := os.MkdirTemp(s.rootfsDir(), ".tmp-")
	if err != nil {
		return "", err
	}
	done := false
	defer func() {
		if !done {
			if err := removeTree(tmp); err != nil {
				log.G(ctx).WithError(err).WithField("path", tmp).Warn("remove partial rootfs")
			}
		}
	}()

	u := newUnpacker(tmp)
	if u.rootless {
		// Owners stay metadata: see owners.go.
		u.owners = newOwnerLog()
		if parent != "" {
			if u.owners, err = readOwners(parent + ownersSuffix); err != nil {
				return "", fmt.Errorf("owners of parent chain %s: %w", chainIDs[n-2], err)
			}
		}
	}
	if parent != "" {
		if err := u.copyTree(parent); err != nil {
			return "", fmt.Errorf("copy parent chain %s: %w", chainIDs[n-2], err)
		}
	}
	if err := u.apply(ctx, s.content, img.Layers[n-1], img.Config.RootFS.DiffIDs[n-1]); err != nil {
		return "", fmt.Errorf("unpack layer %d of image %q (%s): %w", n, img.Name, img.Layers[n-1].Digest, err)
	}
	if err := u.finish(); err != nil {
		return "", err
	}
	if u.owners != nil {
		// Before the chain appears: a chain without it has none.
		if err := u.owners.write(final + ownersSuffix); err != nil {
			return "", fmt.Errorf("record owners of rootfs %s: %w", chainIDs[n-1], err)
		}
	}
	if err := os.Rename(tmp, final); err != nil {
		return "", fmt.Errorf("commit rootfs %s: %w", chainIDs[n-1], err)
	}
	done = true
	log.G(ctx).WithField("chain", chainIDs[n-1]).WithField("image", img.Name).Debug("unpacked layer chain")
	return final, nil
}

// unpacker builds one chain directory.
type unpacker struct {
	root     string
	rootless bool
	// dirModes holds, when rootless, the wanted permissions of directories
	// (by path inside root) that are kept owner-writable while being built.
	dirModes map[string]uint32
	// owners, when rootless, records the owners the layers give entries
	// (owners.go).
	owners *ownerLog
}

func newUnpacker(root string) *unpacker {
	return &unpacker{root: root, rootless: os.Geteuid() != 0, dirModes: map[string]uint32{}}
}

// copyTree fills u.root with a copy of src: directories are created afresh
// with src's metadata, everything else is hard-linked.
func (u *unpacker) copyTree(src string) error {
	if err := u.copyDir(src, u.root, "/"); err != nil {
		return err
	}
	return u.copyDirMeta(src, u.root, "/")
}

func (u *unpacker) copyDir(src, dst, rel string) error {
	entries, err := os.ReadDir(src)
	if err != nil {
		return err
	}
	for _, e := range entries {
		sp, dp, r := filepath.Join(src, e.Name()), filepath.Join(dst, e.Name()), filepath.Join(rel, e.Name())
		if !e.IsDir() {
			if err := os.Link(sp, dp); err != nil {
				return err
			}
			continue
		}
		if err := os.Mkdir(dp, 0o700); err != nil {
			return err
		}
		if err := u.copyDir(sp, dp, r); err != nil {
			return err
		}
		if err := u.copyDirMeta(sp, dp, r); err != nil {
			return err
		}
	}
	return nil
}

// copyDirMeta gives directory dst the owner, mode, extended attributes and
// times of src.
func (u *unpacker) copyDirMeta(src, dst, rel string) error {
	var st unix.Stat_t
	if err := unix.Lstat(src, &st); err != nil {
		return &os.PathError{Op: "lstat", Path: src, Err: err}
	}
	if !u.rootless {
		if err := os.Lchown(dst, int(st.Uid), int(st.Gid)); err != nil {
			return err
		}
	}
	if err := unix.Chmod(dst, u.buildDirMode(rel, st.Mode&0o7777)); err != nil {
		return &os.PathError{Op: "chmod", Path: dst, Err: err}
	}
	copyXattrs(src, dst)
	return setTimes(dst, &st)
}

// buildDirMode returns the mode a directory gets while the chain is built
// and remembers the one it must end with.
func (u *unpacker) buildDirMode(rel string, mode uint32) uint32 {
	if !u.rootless || mode&0o700 == 0o700 {
		delete(u.dirModes, rel)
		return mode
	}
	u.dirModes[rel] = mode
	return mode | 0o700
}

// apply applies the layer desc to u.root, verifying the compressed blob
// against desc.Digest and the uncompressed stream against diffID.
func (u *unpacker) apply(ctx context.Context, cs content.Provider, desc ocispec.Descriptor, diffID digest.Digest) error {
	if err := desc.Digest.Validate(); err != nil {
		return fmt.Errorf("layer digest: %v: %w", err, errdefs.ErrInvalidArgument)
	}
	if err := diffID.Validate(); err != nil {
		return fmt.Errorf("diff_id: %v: %w", err, errdefs.ErrInvalidArgument)
	}
	ra, err := cs.ReaderAt(ctx, desc)
	if err != nil {
		return err
	}
	defer ra.Close()
	if ra.Size() != desc.Size {
		return fmt.Errorf("blob is %d bytes, descriptor says %d: %w", ra.Size(), desc.Size, ErrCorrupt)
	}
	blobDigest := desc.Digest.Algorithm().Digester()
	raw := io.TeeReader(content.NewReader(ra), blobDigest.Hash())
	diffDigest := diffID.Algorithm().Digester()

	applyErr := func() error {
		ds, err := compression.DecompressStream(raw)
		if err != nil {
			return err
		}
		defer ds.Close()
		tr := io.TeeReader(ds, diffDigest.Hash())
		opts := []archive.ApplyOpt{archive.WithFilter(u.filter(ctx))}
		if u.rootless {
			opts = append(opts, archive.WithNoSameOwner())
		}
		if _, err := archive.Apply(ctx, u.root, tr, opts...); err != nil {
			return err
		}
		// Hash what follows the end-of-archive marker too, and let the
		// decompressor check its own trailer.
		_, err = io.Copy(io.Discard, tr)
		return err
	}()
	if _, err := io.Copy(io.Discard, raw); err != nil && applyErr == nil {
		applyErr = err
	}
	if got := blobDigest.Digest(); got != desc.Digest {
		return fmt.Errorf("layer blob digest is %s, expected %s: %w", got, desc.Digest, ErrCorrupt)
	}
	if applyErr != nil {
		return applyErr
	}
	if got := diffDigest.Digest(); got != diffID {
		return fmt.Errorf("uncompressed layer digest is %s, config diff_id is %s: %w", got, diffID, ErrCorrupt)
	}
	return nil
}

// filter runs on every tar header before archive.Apply acts on it. It keeps
// hard links from writing through to inodes shared with the parent chain and,
// when rootless, drops what an unprivileged user cannot create.
func (u *unpacker) filter(ctx context.Context) archive.Filter {
	created := map[string]bool{} // paths this layer has created (fresh inodes)
	return func(hdr *tar.Header) (bool, error) {
		name := filepath.Clean("/" + hdr.Name)
		if strings.HasPrefix(filepath.Base(name), ".wh.") {
			if u.owners != nil {
				u.owners.record(name, hdr)
			}
			return true, nil
		}
		switch hdr.Typeflag {
		case tar.TypeBlock, tar.TypeChar, tar.TypeFifo:
			// The host never gets a device node or a FIFO from an
			// image: one would reach a host device, the other block
			// whoever on the host opens it. A sandbox has its own /dev.
			log.G(ctx).WithField("path", name).Debug("skipping special file")
			return false, nil
		}
		if u.rootless {
			for k := range hdr.PAXRecords {
				if strings.HasPrefix(k, "SCHILY.xattr.") && !strings.HasPrefix(k, "SCHILY.xattr.user.") {
					delete(hdr.PAXRecords, k)
				}
			}
			if hdr.Typeflag == tar.TypeDir {
				hdr.Mode = int64(u.buildDirMode(name, uint32(hdr.Mode)&0o7777)) | hdr.Mode&^0o7777
			}
		}
		if hdr.Typeflag == tar.TypeLink && !created[filepath.Clean("/"+hdr.Linkname)] {
			// archive.Apply links to the target and then sets the entry's
			// owner, mode, xattrs and times on that inode. If the target came
			// from the parent chain, give this chain its own copy first.
			if err := u.breakLink(hdr.Linkname); err != nil {
				return false, fmt.Errorf("copy up hard link target %q: %w", hdr.Linkname, err)
			}
		}
		created[name] = true
		if u.owners != nil {
			u.owners.record(name, hdr)
		}
		return true, nil
	}
}

// breakLink replaces the file linkname names inside u.root with a private
// copy when its inode is shared with another tree.
func (u *unpacker) breakLink(linkname string) error {
	dir, base := filepath.Split(filepath.Clean("/" + linkname))
	dir, err := cfs.RootPath(u.root, dir)
	if err != nil {
		return err
	}
	p := filepath.Join(dir, base)
	if !strings.HasPrefix(p, u.root+string(filepath.Separator)) {
		return nil // archive.Apply refuses it
	}
	var st unix.Stat_t
	if err := unix.Lstat(p, &st); err != nil || st.Nlink < 2 || st.Mode&unix.S_IFMT == unix.S_IFDIR {
		return nil // absent (Apply reports it) or already private
	}
	tmp := filepath.Join(dir, ".hutch-copyup-"+randomHex())
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFREG:
		err = copyFile(p, tmp)
	case unix.S_IFLNK:
		var target string
		if target, err = os.Readlink(p); err == nil {
			err = os.Symlink(target, tmp)
		}
	default:
		err = unix.Mknod(tmp, st.Mode, int(st.Rdev))
	}
	if err == nil && !u.rootless {
		err = os.Lchown(tmp, int(st.Uid), int(st.Gid))
	}
	if err == nil && st.Mode&unix.S_IFMT != unix.S_IFLNK {
		err = unix.Chmod(tmp, st.Mode&0o7777)
	}
	if err == nil {
		copyXattrs(p, tmp)
		err = setTimes(tmp, &st)
	}
	if err == nil {
		err = os.Rename(tmp, p)
	}
	if err != nil {
		os.Remove(tmp)
	}
	return err
}

// finish gives directories their final modes; the root is always 0755.
func (u *unpacker) finish() error {
	paths := make([]string, 0, len(u.dirModes))
	for p := range u.dirModes {
		paths = append(paths, p)
	}
	// Deepest first, so that no directory loses search permission before
	// its children are done.
	sort.Slice(paths, func(i, j int) bool {
		return strings.Count(paths[i], "/") > strings.Count(paths[j], "/")
	})
	for _, rel := range paths {
		p, err := cfs.RootPath(u.root, rel)
		if err != nil {
			return err
		}
		if fi, err := os.Lstat(p); err != nil || !fi.IsDir() {
			continue // removed by a later whiteout
		}
		// The owner keeps read and search permission so that the chain can
		// be copied and removed without privileges.
		if err := unix.Chmod(p, u.dirModes[rel]|0o500); err != nil {
			return &os.PathError{Op: "chmod", Path: p, Err: err}
		}
	}
	return os.Chmod(u.root, 0o755)
}

func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	_, err = io.Copy(out, in)
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	return err
}

// copyXattrs copies what extended attributes it can; the filesystem or the
// caller's privileges may not allow all of them.
func copyXattrs(src, dst string) {
	names, err := sysx.LListxattr(src)
	if err != nil {
		return
	}
	for _, n := range names {
		v, err := sysx.LGetxattr(src, n)
		if err != nil {
			continue
		}
		_ = sysx.LSetxattr(dst, n, v, 0)
	}
}

func setTimes(p string, st *unix.Stat_t) error {
	ts := []unix.Timespec{st.Atim, st.Mtim}
	if err := unix.UtimesNanoAt(unix.AT_FDCWD, p, ts, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return &os.PathError{Op: "utimes", Path: p, Err: err}
	}
	return nil
}

// removeTree removes p and everything below it, first making directories
// owner-writable if an unprivileged caller needs that.
func removeTree(p string) error {
	if err := os.RemoveAll(p); err == nil {
		return nil
	}
	_ = filepath.WalkDir(p, func(q string, d fs.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			_ = os.Chmod(q, 0o700)
		}
		return nil
	})
	return os.RemoveAll(p)
}

func randomHex() string {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err)
	}
	return hex.EncodeToString(b[:])
}
