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
	"runtime"
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

// listDir lists the regular files of dir with their sizes, sorted by name.
func listDir(dir string) ([]CheckpointFile, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	out := make([]CheckpointFile, len(ents))
	for i, e := range ents {
		fi, err := e.Info()
		if err != nil {
			return nil, err
		}
		if !fi.Mode().IsRegular() {
			return nil, fmt.Errorf("%s is not a regular file: %w", e.Name(), errdefs.ErrInvalidArgument)
		}
		out[i] = CheckpointFile{Name: e.Name(), Size: fi.Size()}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// hashDir lists and checksums the regular files of dir.
func hashDir(dir string) ([]CheckpointFile, error) {
	out, err := listDir(dir)
	if err != nil {
		return nil, err
	}
	return checksummed(dir, out)
}

// checksummed returns files (of dir) with their chunk checksums.
func checksummed(dir string, files []CheckpointFile) ([]CheckpointFile, error) {
	out := make([]CheckpointFile, len(files))
	for i, f := range files {
		out[i] = CheckpointFile{Name: f.Name, Size: f.Size, ChunkSize: checksumChunk}
	}
	sums, err := chunkSums(dir, out)
	if err != nil {
		return nil, err
	}
	for i := range out {
		out[i].XXH64Chunks = sums[i]
	}
	return out, nil
}

// sealed reports whether the manifest itself holds every file's checksum.
func (c Checkpoint) sealed() bool {
	for _, f := range c.Files {
		if f.ChunkSize <= 0 && f.XXH64 == "" && f.Digest == "" {
			return false
		}
	}
	return true
}

// checkpointSums is sums.json, the checksums of a checkpoint committed
// unsealed.
type checkpointSums struct {
	Files []CheckpointFile `json:"files"`
}

// SealCheckpoint checksums the files of checkpoint dgst, committed by
// CommitUnsealed, and records the checksums beside its manifest, unless
// that was done already. It refuses, wrapping ErrCorrupt, a checkpoint
// whose files are not the size its manifest says, and one committed
// before the host last restarted.
func (s *Store) SealCheckpoint(ctx context.Context, dgst digest.Digest) error {
	ck, err := s.readCheckpoint(dgst)
	if err != nil || ck.sealed() {
		return err
	}
	_, _, err = s.seal(ck)
	return err
}

// seal returns the checksums of unsealed checkpoint ck: those sums.json
// records, or, if it has none yet, those of its files now, which it then
// records. Sealing is serialized by a lock of the checkpoint's. fresh
// reports checksums computed while seal ran, by it or by the sealer whose
// lock it waited for: there is then nothing older to check the files
// against, and reading them once more would check nothing.
func (s *Store) seal(ck Checkpoint) (files []CheckpointFile, fresh bool, err error) {
	short := ck.Digest.Encoded()[:12]
	top := s.checkpointPath(ck.Digest)
	sumsPath := filepath.Join(top, "sums.json")
	_, err = os.Stat(sumsPath)
	sealedBefore := err == nil
	l, err := lockPath(filepath.Join(top, "seal.lock"), unix.LOCK_EX)
	if err != nil {
		return nil, false, err
	}
	defer l.Unlock()
	b, err := os.ReadFile(sumsPath)
	switch {
	case err == nil:
		var sums checkpointSums
		if err := json.Unmarshal(b, &sums); err != nil || !sameFiles(sums.Files, ck.Files) {
			return nil, false, fmt.Errorf("checkpoint %s: its checksums (sums.json) do not match its manifest: %w", short, ErrCorrupt)
		}
		return sums.Files, !sealedBefore, nil
	case !errors.Is(err, fs.ErrNotExist):
		return nil, false, err
	}
	if ck.Boot != bootID() {
		return nil, false, fmt.Errorf("checkpoint %s was never checksummed, and the host has restarted since it was written: %w", short, ErrCorrupt)
	}
	dir := filepath.Join(top, "image")
	for _, f := range ck.Files {
		fi, err := os.Lstat(filepath.Join(dir, f.Name))
		if err != nil || !fi.Mode().IsRegular() || fi.Size() != f.Size {
			return nil, false, fmt.Errorf("checkpoint %s: file %s is not the regular file of %d bytes its manifest lists: %w", short, f.Name, f.Size, ErrCorrupt)
		}
	}
	if files, err = checksummed(dir, ck.Files); err != nil {
		return nil, false, fmt.Errorf("checkpoint %s: %w", short, err)
	}
	b, err = json.Marshal(checkpointSums{Files: files})
	if err != nil {
		return nil, false, err
	}
	if err := writeFileAtomic(sumsPath, b, 0o600); err != nil {
		return nil, false, fmt.Errorf("checkpoint %s: %w", short, err)
	}
	return files, true, nil
}

// sameFiles reports whether a and b list the same names and sizes.
func sameFiles(a, b []CheckpointFile) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i].Name != b[i].Name || a[i].Size != b[i].Size {
			return false
		}
	}
	return true
}

// bootID is the host's boot ID.
var bootID = sync.OnceValue(func() string {
	b, _ := os.ReadFile("/proc/sys/kernel/random/boot_id")
	return strings.TrimSpace(string(b))
})

// chunkSums returns the XXH64 checksums, in hex, of the chunks of each of
// files (of dir), of files[i].ChunkSize bytes up to files[i].Size. The
// chunks of every file are spread over as many goroutines as there are
// CPUs: a checkpoint is mostly one large file of memory pages, whose
// chunks are then checksummed at once.
func chunkSums(dir string, files []CheckpointFile) ([][]string, error) {
	type chunk struct {
		file, i int
		off, n  int64
	}
	var chunks []chunk
	sums := make([][]string, len(files))
	fds := make([]*os.File, len(files))
	defer func() {
		for _, f := range fds {
			if f != nil {
				f.Close()
			}
		}
	}()
	for i, f := range files {
		fd, err := os.Open(filepath.Join(dir, f.Name))
		if err != nil {
			return nil, err
		}
		fds[i] = fd
		if f.ChunkSize <= 0 {
			return nil, fmt.Errorf("%s: chunk size %d: %w", f.Name, f.ChunkSize, errdefs.ErrInvalidArgument)
		}
		n := int((f.Size + f.ChunkSize - 1) / f.ChunkSize)
		sums[i] = make([]string, n)
		for j := range n {
			off := int64(j) * f.ChunkSize
			chunks = append(chunks, chunk{file: i, i: j, off: off, n: min(f.ChunkSize, f.Size-off)})
		}
	}
	work := make(chan chunk)
	errs := make([]error, runtime.GOMAXPROCS(0))
	var wg sync.WaitGroup
	for w := range errs {
		wg.Go(func() {
			buf := make([]byte, 1<<20)
			h := xxhash.New()
			for c := range work {
				if errs[w] != nil {
					continue
				}
				h.Reset()
				n, err := io.CopyBuffer(h, io.NewSectionReader(fds[c.file], c.off, c.n), buf)
				if err == nil && n != c.n {
					err = fmt.Errorf("%s is shorter than %d bytes", files[c.file].Name, c.off+c.n)
				}
				errs[w] = err
				sums[c.file][c.i] = fmt.Sprintf("%016x", h.Sum64())
			}
		})
	}
	for _, c := range chunks {
		work <- c
	}
	close(work)
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return sums, nil
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

// verifyFile checks file p against f's checksum as earlier versions
// recorded it (of the whole file).
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

// verifyChunks checks the files of dir whose manifest entries have chunk
// checksums (a ChunkSize) against them, and returns one error per damaged file.
func verifyChunks(dir string, files []CheckpointFile) []error {
	var chunked []CheckpointFile
	for _, f := range files {
		if f.ChunkSize > 0 {
			chunked = append(chunked, f)
		}
	}
	if len(chunked) == 0 {
		return nil
	}
	for _, f := range chunked {
		if n := (f.Size + f.ChunkSize - 1) / f.ChunkSize; int64(len(f.XXH64Chunks)) != n {
			return []error{fmt.Errorf("file %s: manifest lists %d chunk checksums of %d bytes for %d bytes", f.Name, len(f.XXH64Chunks), f.ChunkSize, f.Size)}
		}
	}
	sums, err := chunkSums(dir, chunked)
	if err != nil {
		return []error{err}
	}
	var bad []error
	for i, f := range chunked {
		for j, want := range f.XXH64Chunks {
			if sums[i][j] != want {
				bad = append(bad, fmt.Errorf("file %s: bytes %d to %d have checksum %s, manifest says %s", f.Name,
					int64(j)*f.ChunkSize, min(int64(j+1)*f.ChunkSize, f.Size), sums[i][j], want))
				break
			}
		}
	}
	return bad
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
