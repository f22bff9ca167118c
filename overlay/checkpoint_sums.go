package overlay

// Checksums of checkpoint files: per 16 MiB chunk on every CPU, sealed
// at commit or later (sums.json), and verified against them.

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

	"github.com/cespare/xxhash/v2"
	"github.com/containerd/errdefs"
	"github.com/opencontainers/go-digest"
	"golang.org/x/sys/unix"
)

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
