package overlay

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/containerd/log"
	"github.com/opencontainers/go-digest"
	"github.com/opencontainers/image-spec/identity"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"golang.org/x/sys/unix"
)

// Remove untags name and garbage-collects the blobs and rootfs directories
// no longer referenced by any image or lease (see Prune). A name that is not
// tagged yields an error wrapping errdefs.ErrNotFound. A rootfs held by a
// lease survives until the lease is released and the store is pruned again.
func (s *Store) Remove(ctx context.Context, name string) error {
	n, err := ParseName(name)
	if err != nil {
		return err
	}
	if err := s.untag(n); err != nil {
		return err
	}
	if _, err := s.gc(ctx); err != nil {
		return fmt.Errorf("image %q untagged, but collecting its data failed: %w", n, err)
	}
	return nil
}

// Prune removes every blob and rootfs chain that no tagged image and no
// lease references, plus leftovers of interrupted imports and unpacks, and
// returns the number of bytes freed. A chain counts as referenced when it is
// the chain of a tagged image or one of its parent chains, or when a lease
// names it. Bytes in rootfs files still hard-linked from a kept chain are
// not counted.
//
// Prune waits for imports, commits, exports and unpacks in progress (in any
// process) to finish, and they wait for it.
func (s *Store) Prune(ctx context.Context) (int64, error) {
	return s.gc(ctx)
}

func (s *Store) gc(ctx context.Context) (int64, error) {
	l, err := lockPath(s.gcLockPath(), unix.LOCK_EX)
	if err != nil {
		return 0, err
	}
	defer l.Unlock()

	blobs, chains, err := s.referenced(ctx)
	if err != nil {
		return 0, fmt.Errorf("garbage collection: %w", err)
	}
	var freed int64

	// Blobs.
	algs, err := os.ReadDir(filepath.Join(s.ociDir(), "blobs"))
	if err != nil {
		return 0, err
	}
	for _, a := range algs {
		dir := filepath.Join(s.ociDir(), "blobs", a.Name())
		entries, err := os.ReadDir(dir)
		if err != nil {
			continue
		}
		for _, e := range entries {
			d := digest.NewDigestFromEncoded(digest.Algorithm(a.Name()), e.Name())
			if blobs[d] {
				continue
			}
			if fi, err := e.Info(); err == nil {
				freed += fi.Size()
			}
			if err := os.Remove(filepath.Join(dir, e.Name())); err != nil && !errors.Is(err, fs.ErrNotExist) {
				return freed, err
			}
			log.G(ctx).WithField("digest", d).Debug("removed blob")
		}
	}
	// Interrupted ingests: every writer holds the gc lock shared.
	if entries, err := os.ReadDir(filepath.Join(s.ociDir(), "ingest")); err == nil {
		for _, e := range entries {
			p := filepath.Join(s.ociDir(), "ingest", e.Name())
			freed += treeSize(p)
			_ = os.RemoveAll(p)
		}
	}

	// Interrupted layer writes (blobWriter).
	if entries, err := os.ReadDir(s.tmpDir()); err == nil {
		for _, e := range entries {
			p := filepath.Join(s.tmpDir(), e.Name())
			freed += treeSize(p)
			_ = os.RemoveAll(p)
		}
	}

	// Interrupted checkpoint ingests and deletions, and the chunks no
	// checkpoint names.
	freed += s.pruneCheckpointLeftovers(ctx)
	if n, err := s.pruneChunksLocked(ctx); err != nil {
		log.G(ctx).WithError(err).Warn("collect checkpoint chunks")
	} else {
		freed += n
	}

	// Rootfs chains and interrupted unpacks.
	entries, err := os.ReadDir(s.rootfsDir())
	if err != nil {
		return freed, err
	}
	for _, e := range entries {
		n := e.Name()
		// A chain's owners file (owners.go) goes with its chain.
		chain := strings.TrimSuffix(n, ownersSuffix)
		if chains[chain] || !(strings.HasPrefix(n, ".") || len(chain) == 64) {
			continue
		}
		p := filepath.Join(s.rootfsDir(), n)
		if !strings.HasPrefix(n, ".del-") {
			// Out of the way first, so a crash leaves no incomplete chain
			// under a chain name.
			q := filepath.Join(s.rootfsDir(), ".del-"+randomHex())
			if err := os.Rename(p, q); err != nil {
				return freed, err
			}
			p = q
		}
		size := treeSize(p)
		if err := removeTree(p); err != nil {
			return freed, fmt.Errorf("remove rootfs %s: %w", n, err)
		}
		freed += size
		log.G(ctx).WithField("chain", n).Debug("removed rootfs")
	}

	// Chain lock files: every holder also holds the gc lock shared.
	if entries, err := os.ReadDir(s.lockDir()); err == nil {
		for _, e := range entries {
			if strings.HasPrefix(e.Name(), "chain-") {
				_ = os.Remove(filepath.Join(s.lockDir(), e.Name()))
			}
		}
	}
	return freed, nil
}

// referenced returns the blobs and rootfs chain directory names (hex) that
// tagged images and leases keep.
func (s *Store) referenced(ctx context.Context) (map[digest.Digest]bool, map[string]bool, error) {
	blobs := map[digest.Digest]bool{}
	chains := map[string]bool{}
	idx, err := s.readIndex()
	if err != nil {
		return nil, nil, err
	}
	for _, d := range idx.Manifests {
		blobs[d.Digest] = true
		mb, err := s.readBlob(ctx, d)
		if err != nil {
			return nil, nil, fmt.Errorf("image %q: manifest: %w", d.Annotations[ocispec.AnnotationRefName], err)
		}
		var m ocispec.Manifest
		if err := json.Unmarshal(mb, &m); err != nil {
			return nil, nil, fmt.Errorf("image %q: parse manifest: %v: %w", d.Annotations[ocispec.AnnotationRefName], err, ErrCorrupt)
		}
		blobs[m.Config.Digest] = true
		for _, l := range m.Layers {
			blobs[l.Digest] = true
		}
		cb, err := s.readBlob(ctx, m.Config)
		if err != nil {
			return nil, nil, fmt.Errorf("image %q: config: %w", d.Annotations[ocispec.AnnotationRefName], err)
		}
		var cfg ocispec.Image
		if err := json.Unmarshal(cb, &cfg); err != nil {
			return nil, nil, fmt.Errorf("image %q: parse config: %v: %w", d.Annotations[ocispec.AnnotationRefName], err, ErrCorrupt)
		}
		for _, c := range identity.ChainIDs(append([]digest.Digest(nil), cfg.RootFS.DiffIDs...)) {
			chains[c.Encoded()] = true
		}
	}
	leases, err := os.ReadDir(s.leaseDir())
	if err != nil {
		return nil, nil, err
	}
	for _, e := range leases {
		b, err := os.ReadFile(filepath.Join(s.leaseDir(), e.Name()))
		if err != nil {
			continue
		}
		chains[strings.TrimSpace(string(b))] = true
	}
	return blobs, chains, nil
}

// treeSize sums the sizes of the regular files under p that no other
// directory entry links to.
func treeSize(p string) int64 {
	var n int64
	_ = filepath.WalkDir(p, func(q string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return nil
		}
		var st unix.Stat_t
		if unix.Lstat(q, &st) == nil && st.Nlink == 1 {
			n += st.Size
		}
		return nil
	})
	return n
}
