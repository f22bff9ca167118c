package overlay

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/cespare/xxhash/v2"
	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	"github.com/opencontainers/go-digest"
	"golang.org/x/sys/unix"
)

// Checkpoint is a stored memory checkpoint: the files runsc checkpoint
// wrote, under the digest of the manifest that lists them.
//
// On disk: R/checkpoints/<hex>/manifest.json (the manifest, whose digest is
// <hex>) and R/checkpoints/<hex>/image/ (runsc's files).
type Checkpoint struct {
	Digest digest.Digest `json:"-"`
	// Files are the checkpoint's files, sorted by name.
	Files []CheckpointFile `json:"files"`
	// Labels are the committer's (e.g. the sandbox it was taken of).
	Labels map[string]string `json:"labels,omitempty"`
	// Created is when it was committed.
	Created time.Time `json:"created"`
	// Dir is the directory of runsc's files; set by Commit, which has
	// just checksummed them, and by OpenCheckpoint once it has verified
	// them.
	Dir string `json:"-"`
}

// CheckpointFile is one file of a checkpoint, with the checksum that
// OpenCheckpoint verifies it against: XXH64 for checkpoints committed now,
// Digest (SHA-256) for those committed by earlier versions.
//
// A checkpoint never leaves the host that wrote it and is never taken from
// anyone else: its checksum is there to catch a file damaged or cut short
// on disk, not an adversary (who could rewrite the manifest and the
// sandbox record as well). XXH64 does that at memory speed, about ten
// times faster than SHA-256, which a pause and a resume of a large sandbox
// would otherwise spend most of their time on (docs/decisions/0018).
type CheckpointFile struct {
	Name   string        `json:"name"`
	Size   int64         `json:"size"`
	Digest digest.Digest `json:"digest,omitempty"`
	XXH64  string        `json:"xxh64,omitempty"`
}

// Size is the total size of the checkpoint's files.
func (c Checkpoint) Size() int64 {
	var n int64
	for _, f := range c.Files {
		n += f.Size
	}
	return n
}

// CheckpointIngest is a checkpoint being written: runsc writes into Dir,
// then Commit makes it a stored checkpoint or Abort drops it. Until then
// it is invisible, and a process killed meanwhile leaves only a hidden
// directory that Prune removes.
type CheckpointIngest struct {
	s    *Store
	tmp  string // R/checkpoints/.ingest-<random>
	gc   *fileLock
	done bool
}

func (s *Store) checkpointsDir() string { return filepath.Join(s.root, "checkpoints") }

func (s *Store) checkpointPath(d digest.Digest) string {
	return filepath.Join(s.checkpointsDir(), d.Encoded())
}

// NewCheckpoint starts a checkpoint ingest. The caller must Commit or
// Abort it; collection waits for it meanwhile.
func (s *Store) NewCheckpoint(ctx context.Context) (*CheckpointIngest, error) {
	// Checkpoints hold the sandbox's memory, so its secrets: owner-only,
	// whatever the umask and whatever made the directory before.
	if err := os.MkdirAll(s.checkpointsDir(), 0o700); err != nil {
		return nil, err
	}
	if err := os.Chmod(s.checkpointsDir(), 0o700); err != nil {
		return nil, err
	}
	gc, err := lockPath(s.gcLockPath(), unix.LOCK_SH)
	if err != nil {
		return nil, err
	}
	tmp, err := os.MkdirTemp(s.checkpointsDir(), ".ingest-")
	if err != nil {
		gc.Unlock()
		return nil, err
	}
	if err := os.Mkdir(filepath.Join(tmp, "image"), 0o700); err != nil {
		gc.Unlock()
		os.RemoveAll(tmp)
		return nil, err
	}
	return &CheckpointIngest{s: s, tmp: tmp, gc: gc}, nil
}

// Dir is the directory the checkpoint's files are written to.
func (ci *CheckpointIngest) Dir() string { return filepath.Join(ci.tmp, "image") }

// Abort drops the ingest and everything written to it. It is a no-op after
// Commit.
func (ci *CheckpointIngest) Abort() {
	if ci.done {
		return
	}
	ci.done = true
	if err := removeTree(ci.tmp); err != nil {
		log.L.WithError(err).WithField("path", ci.tmp).Warn("remove checkpoint ingest")
	}
	ci.gc.Unlock()
}

// Commit checksums every file written to Dir, records them in a manifest and
// makes the checkpoint visible under the manifest's digest. Dir must hold
// regular files only. On error the ingest is aborted.
func (ci *CheckpointIngest) Commit(ctx context.Context, labels map[string]string) (Checkpoint, error) {
	if ci.done {
		return Checkpoint{}, fmt.Errorf("checkpoint ingest already finished: %w", errdefs.ErrFailedPrecondition)
	}
	defer ci.Abort()
	ck := Checkpoint{Labels: labels, Created: time.Now().UTC().Truncate(time.Second)}
	files, err := hashDir(ci.Dir())
	if err != nil {
		return Checkpoint{}, fmt.Errorf("checkpoint: %w", err)
	}
	if err := ownerOnlyFiles(ci.Dir(), files); err != nil {
		return Checkpoint{}, fmt.Errorf("checkpoint: %w", err)
	}
	if len(files) == 0 {
		return Checkpoint{}, fmt.Errorf("checkpoint: no files were written: %w", errdefs.ErrFailedPrecondition)
	}
	ck.Files = files
	mb, err := json.MarshalIndent(ck, "", "  ")
	if err != nil {
		return Checkpoint{}, err
	}
	ck.Digest = digest.FromBytes(mb)
	if err := writeFileAtomic(filepath.Join(ci.tmp, "manifest.json"), mb, 0o600); err != nil {
		return Checkpoint{}, err
	}
	final := ci.s.checkpointPath(ck.Digest)
	if err := os.Rename(ci.tmp, final); err != nil {
		if _, serr := os.Stat(final); serr == nil {
			// The same checkpoint is stored already.
			ck.Dir = filepath.Join(final, "image")
			return ck, nil
		}
		return Checkpoint{}, fmt.Errorf("commit checkpoint: %w", err)
	}
	ci.done = true
	ci.gc.Unlock()
	ck.Dir = filepath.Join(final, "image")
	return ck, nil
}

// hashDir lists and checksums the regular files of dir, concurrently.
func hashDir(dir string) ([]CheckpointFile, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	out := make([]CheckpointFile, len(ents))
	errs := make([]error, len(ents))
	for _, e := range ents {
		if !e.Type().IsRegular() {
			return nil, fmt.Errorf("%s is not a regular file: %w", e.Name(), errdefs.ErrInvalidArgument)
		}
	}
	var wg sync.WaitGroup
	for i, e := range ents {
		wg.Go(func() {
			sum, n, err := xxh64File(filepath.Join(dir, e.Name()))
			out[i], errs[i] = CheckpointFile{Name: e.Name(), Size: n, XXH64: sum}, err
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// ownerOnlyFiles makes dir 0700 and its files 0600, whatever modes and
// umask the writer (runsc) used.
func ownerOnlyFiles(dir string, files []CheckpointFile) error {
	if err := os.Chmod(dir, 0o700); err != nil {
		return err
	}
	for _, f := range files {
		if err := os.Chmod(filepath.Join(dir, f.Name), 0o600); err != nil {
			return err
		}
	}
	return nil
}

func hashFile(p string) (digest.Digest, int64, error) {
	f, err := os.Open(p)
	if err != nil {
		return "", 0, err
	}
	defer f.Close()
	dg := digest.Canonical.Digester()
	n, err := io.Copy(dg.Hash(), f)
	if err != nil {
		return "", 0, err
	}
	return dg.Digest(), n, nil
}

// xxh64File returns the XXH64 checksum of file p, in hex, and its size.
func xxh64File(p string) (string, int64, error) {
	f, err := os.Open(p)
	if err != nil {
		return "", 0, err
	}
	defer f.Close()
	h := xxhash.New()
	n, err := io.CopyBuffer(h, f, make([]byte, 1<<20))
	if err != nil {
		return "", 0, err
	}
	return fmt.Sprintf("%016x", h.Sum64()), n, nil
}

// verifyFile checks file p against f's checksum.
func verifyFile(p string, f CheckpointFile) error {
	switch {
	case f.XXH64 != "":
		sum, _, err := xxh64File(p)
		if err == nil && sum != f.XXH64 {
			err = fmt.Errorf("file %s has checksum %s, manifest says %s", f.Name, sum, f.XXH64)
		}
		return err
	case f.Digest != "":
		d, _, err := hashFile(p)
		if err == nil && d != f.Digest {
			err = fmt.Errorf("file %s has digest %s, manifest says %s", f.Name, d, f.Digest)
		}
		return err
	}
	return fmt.Errorf("file %s has no checksum in the manifest", f.Name)
}

// OpenCheckpoint returns the checkpoint dgst after verifying its manifest
// and every file against it: same set of files, sizes and checksums. A
// mismatch wraps ErrCorrupt; an unknown checkpoint errdefs.ErrNotFound.
// The files must not be modified: the caller only reads ck.Dir.
func (s *Store) OpenCheckpoint(ctx context.Context, dgst digest.Digest) (Checkpoint, error) {
	ck, err := s.readCheckpoint(dgst)
	if err != nil {
		return Checkpoint{}, err
	}
	dir := filepath.Join(s.checkpointPath(dgst), "image")
	ents, err := os.ReadDir(dir)
	if err != nil {
		return Checkpoint{}, fmt.Errorf("checkpoint %s: %v: %w", dgst.Encoded()[:12], err, ErrCorrupt)
	}
	if len(ents) != len(ck.Files) {
		return Checkpoint{}, fmt.Errorf("checkpoint %s has %d files, its manifest lists %d: %w", dgst.Encoded()[:12], len(ents), len(ck.Files), ErrCorrupt)
	}
	// Hash the files concurrently: most of the time goes into the
	// largest one, but the others need not wait for it.
	errs := make(chan error, len(ck.Files))
	for _, f := range ck.Files {
		go func(f CheckpointFile) {
			p := filepath.Join(dir, f.Name)
			fi, err := os.Lstat(p)
			switch {
			case err != nil:
				errs <- fmt.Errorf("file %s: %v", f.Name, err)
				return
			case !fi.Mode().IsRegular() || fi.Size() != f.Size:
				errs <- fmt.Errorf("file %s is %d bytes, manifest says %d", f.Name, fi.Size(), f.Size)
				return
			}
			errs <- verifyFile(p, f)
		}(f)
	}
	var bad []string
	for range ck.Files {
		if err := <-errs; err != nil {
			bad = append(bad, err.Error())
		}
	}
	if len(bad) > 0 {
		sort.Strings(bad)
		return Checkpoint{}, fmt.Errorf("checkpoint %s: %s: %w", dgst.Encoded()[:12], strings.Join(bad, "; "), ErrCorrupt)
	}
	ck.Dir = dir
	return ck, nil
}

// readCheckpoint reads and verifies the manifest of checkpoint dgst.
func (s *Store) readCheckpoint(dgst digest.Digest) (Checkpoint, error) {
	if err := dgst.Validate(); err != nil {
		return Checkpoint{}, fmt.Errorf("checkpoint digest %q: %v: %w", dgst, err, errdefs.ErrInvalidArgument)
	}
	mb, err := os.ReadFile(filepath.Join(s.checkpointPath(dgst), "manifest.json"))
	if errors.Is(err, fs.ErrNotExist) {
		return Checkpoint{}, fmt.Errorf("checkpoint %s: %w", dgst.Encoded()[:12], errdefs.ErrNotFound)
	}
	if err != nil {
		return Checkpoint{}, err
	}
	if digest.FromBytes(mb) != dgst {
		return Checkpoint{}, fmt.Errorf("checkpoint %s: manifest does not match its digest: %w", dgst.Encoded()[:12], ErrCorrupt)
	}
	var ck Checkpoint
	if err := json.Unmarshal(mb, &ck); err != nil {
		return Checkpoint{}, fmt.Errorf("checkpoint %s: parse manifest: %v: %w", dgst.Encoded()[:12], err, ErrCorrupt)
	}
	ck.Digest = dgst
	return ck, nil
}

// Checkpoints lists the stored checkpoints, without verifying their files.
// Checkpoints whose manifest is unreadable are listed with no files.
func (s *Store) Checkpoints(ctx context.Context) ([]Checkpoint, error) {
	ents, err := os.ReadDir(s.checkpointsDir())
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []Checkpoint
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), ".") {
			continue
		}
		d := digest.NewDigestFromEncoded(digest.Canonical, e.Name())
		ck, err := s.readCheckpoint(d)
		if err != nil {
			ck = Checkpoint{Digest: d}
		}
		out = append(out, ck)
	}
	return out, nil
}

// RemoveCheckpoint deletes checkpoint dgst. Removing one that does not
// exist is not an error. It is moved out of sight first, so that a crash
// never leaves a half-deleted checkpoint under its digest.
func (s *Store) RemoveCheckpoint(ctx context.Context, dgst digest.Digest) error {
	if err := dgst.Validate(); err != nil {
		return fmt.Errorf("checkpoint digest %q: %v: %w", dgst, err, errdefs.ErrInvalidArgument)
	}
	p := s.checkpointPath(dgst)
	q := filepath.Join(s.checkpointsDir(), ".del-"+randomHex())
	if err := os.Rename(p, q); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		return fmt.Errorf("remove checkpoint: %w", err)
	}
	return removeTree(q)
}

// pruneCheckpointLeftovers removes interrupted ingests and deletions. The
// caller holds the gc lock exclusively, so no ingest is in progress.
func (s *Store) pruneCheckpointLeftovers(ctx context.Context) int64 {
	ents, err := os.ReadDir(s.checkpointsDir())
	if err != nil {
		return 0
	}
	var freed int64
	for _, e := range ents {
		if !strings.HasPrefix(e.Name(), ".") {
			continue
		}
		p := filepath.Join(s.checkpointsDir(), e.Name())
		freed += treeSize(p)
		if err := removeTree(p); err != nil {
			log.G(ctx).WithError(err).WithField("path", p).Warn("remove checkpoint leftover")
		}
	}
	return freed
}
