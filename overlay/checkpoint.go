package overlay

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

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
	// Boot, set by CommitUnsealed, is the host's boot ID when the
	// checkpoint was committed without checksums; they are then in
	// sums.json beside the manifest once it is sealed (SealCheckpoint).
	Boot string `json:"boot,omitempty"`
	// Dir is the directory of runsc's files; set by Commit, which has
	// just checksummed them, and by OpenCheckpoint once it has verified
	// them.
	Dir string `json:"-"`
}

// CheckpointFile is one file of a checkpoint, with the checksums that
// OpenCheckpoint verifies it against: XXH64 of each chunk of ChunkSize
// bytes (XXH64Chunks) for checkpoints committed now, XXH64 of the whole
// file or Digest (SHA-256) for those committed by earlier versions.
//
// A checkpoint never leaves the host that wrote it and is never taken from
// anyone else: its checksum is there to catch a file damaged or cut short
// on disk, not an adversary (who could rewrite the manifest and the
// sandbox record as well). XXH64 does that at memory speed, about ten
// times faster than SHA-256, which a pause and a resume of a large sandbox
// would otherwise spend most of their time on (docs/decisions/0018); the
// chunks are checksummed on every CPU at once (docs/decisions/0029).
type CheckpointFile struct {
	Name   string        `json:"name"`
	Size   int64         `json:"size"`
	Digest digest.Digest `json:"digest,omitempty"`
	XXH64  string        `json:"xxh64,omitempty"`
	// ChunkSize is the size of the chunks XXH64Chunks checksums, in
	// order; the last one holds what is left.
	ChunkSize   int64    `json:"chunk_size,omitempty"`
	XXH64Chunks []string `json:"xxh64_chunks,omitempty"`
}

// checksumChunk is the size of the chunks of a checkpoint file that are
// checksummed independently, and so in parallel.
const checksumChunk = 16 << 20

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
	return ci.commit(ctx, labels, true)
}

// CommitUnsealed is Commit without the checksums: the manifest records
// each file's size and the host's boot, and SealCheckpoint, or the first
// OpenCheckpoint, checksums the files later. It lets a pause return before
// reading back everything runsc has just written, while the kernel is
// still writing it to disk (docs/decisions/0029). A checkpoint that was
// not sealed before the host restarted is refused: its files may have
// been cut short by the restart, and nothing recorded what they held.
func (ci *CheckpointIngest) CommitUnsealed(ctx context.Context, labels map[string]string) (Checkpoint, error) {
	return ci.commit(ctx, labels, false)
}

func (ci *CheckpointIngest) commit(ctx context.Context, labels map[string]string, sealed bool) (Checkpoint, error) {
	if ci.done {
		return Checkpoint{}, fmt.Errorf("checkpoint ingest already finished: %w", errdefs.ErrFailedPrecondition)
	}
	defer ci.Abort()
	ck := Checkpoint{Labels: labels, Created: time.Now().UTC().Truncate(time.Second)}
	var files []CheckpointFile
	var err error
	if sealed {
		files, err = hashDir(ci.Dir())
	} else {
		files, err = listDir(ci.Dir())
		ck.Boot = bootID()
	}
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
	// Written into the hidden ingest directory, which the rename below
	// makes visible whole. Not synced to disk, as runsc's files are not:
	// a manifest cut short by a crash no longer matches its digest.
	if err := os.WriteFile(filepath.Join(ci.tmp, "manifest.json"), mb, 0o600); err != nil {
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

// OpenCheckpoint returns the checkpoint dgst after verifying its manifest
// and every file against it: same set of files, sizes and checksums. An
// unsealed checkpoint (CommitUnsealed) is verified against its sums.json,
// or sealed now if it has none yet and the host has not restarted since. A
// mismatch wraps ErrCorrupt; an unknown checkpoint errdefs.ErrNotFound.
// The files must not be modified: the caller only reads ck.Dir.
func (s *Store) OpenCheckpoint(ctx context.Context, dgst digest.Digest) (Checkpoint, error) {
	ck, err := s.readCheckpoint(dgst)
	if err != nil {
		return Checkpoint{}, err
	}
	dir := filepath.Join(s.checkpointPath(dgst), "image")
	if !s.CheckpointWhole(dgst) {
		// Evicted: made again from its chunks (chunks.go), then
		// verified as any.
		if err := s.rebuild(ck); err != nil {
			return Checkpoint{}, err
		}
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return Checkpoint{}, fmt.Errorf("checkpoint %s: %v: %w", dgst.Encoded()[:12], err, ErrCorrupt)
	}
	if len(ents) != len(ck.Files) {
		return Checkpoint{}, fmt.Errorf("checkpoint %s has %d files, its manifest lists %d: %w", dgst.Encoded()[:12], len(ents), len(ck.Files), ErrCorrupt)
	}
	if !ck.sealed() {
		files, fresh, err := s.seal(ck)
		if err != nil {
			return Checkpoint{}, err
		}
		ck.Files = files
		if fresh {
			// Checksummed during this call, in the boot that wrote
			// them: there is nothing older to check them against.
			ck.Dir = dir
			return ck, nil
		}
	}
	// Sizes and kinds first: chunkSums reads no more than the manifest's
	// sizes, so a file grown or cut short must be caught here.
	var bad []string
	var whole []CheckpointFile
	for _, f := range ck.Files {
		fi, err := os.Lstat(filepath.Join(dir, f.Name))
		switch {
		case err != nil:
			bad = append(bad, fmt.Sprintf("file %s: %v", f.Name, err))
		case !fi.Mode().IsRegular() || fi.Size() != f.Size:
			bad = append(bad, fmt.Sprintf("file %s is %d bytes, manifest says %d", f.Name, fi.Size(), f.Size))
		case f.ChunkSize <= 0:
			whole = append(whole, f)
		}
	}
	if len(bad) == 0 {
		for _, err := range verifyChunks(dir, ck.Files) {
			bad = append(bad, err.Error())
		}
		// Files of checkpoints committed by earlier versions, each
		// checksummed whole, concurrently.
		errs := make([]error, len(whole))
		var wg sync.WaitGroup
		for i, f := range whole {
			wg.Go(func() { errs[i] = verifyFile(filepath.Join(dir, f.Name), f) })
		}
		wg.Wait()
		for _, err := range errs {
			if err != nil {
				bad = append(bad, err.Error())
			}
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
	q, err := s.dropCheckpoint(dgst)
	if err != nil || q == "" {
		return err
	}
	return removeTree(q)
}

// DropCheckpoint makes checkpoint dgst invisible at once and leaves its
// files to RemoveDropped (or Prune): deleting the files of a large
// checkpoint takes the kernel a while, which its caller need not wait
// for. Dropping one that does not exist is not an error.
func (s *Store) DropCheckpoint(ctx context.Context, dgst digest.Digest) error {
	_, err := s.dropCheckpoint(dgst)
	return err
}

// dropCheckpoint moves checkpoint dgst out of sight and returns where to,
// or "" if there is no such checkpoint.
func (s *Store) dropCheckpoint(dgst digest.Digest) (string, error) {
	if err := dgst.Validate(); err != nil {
		return "", fmt.Errorf("checkpoint digest %q: %v: %w", dgst, err, errdefs.ErrInvalidArgument)
	}
	p := s.checkpointPath(dgst)
	q := filepath.Join(s.checkpointsDir(), dropPrefix+randomHex())
	if err := os.Rename(p, q); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return "", nil
		}
		return "", fmt.Errorf("remove checkpoint: %w", err)
	}
	return q, nil
}

// dropPrefix names the checkpoints being deleted.
const dropPrefix = ".del-"

// RemoveDropped deletes the files of the checkpoints dropped so far
// (DropCheckpoint, or a deletion a crash interrupted).
func (s *Store) RemoveDropped(ctx context.Context) error {
	ents, err := os.ReadDir(s.checkpointsDir())
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var errs []error
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), dropPrefix) {
			errs = append(errs, removeTree(filepath.Join(s.checkpointsDir(), e.Name())))
		}
	}
	return errors.Join(errs...)
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
