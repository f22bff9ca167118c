package overlay

// Content-defined chunks of checkpoint files. A checkpoint's memory image
// is cut where a rolling hash of its bytes says so, not at fixed offsets:
// a change in one place, or pages saved a little further on, leaves the
// other cuts where they were. Each chunk is stored once, by its SHA-256,
// in R/chunks/<2 hex>/<hex>, however many checkpoints hold it; a
// checkpoint records its chunks in chunks.json beside its manifest. Its
// whole files may then go (EvictCheckpoint): OpenCheckpoint makes them
// again from the chunks before verifying them. Chunks no checkpoint names
// are collected with the rest of the store (Prune, PruneChunks).

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	"github.com/opencontainers/go-digest"
	"golang.org/x/sys/unix"
)

// Chunk sizes: at least chunkMin, at most chunkMax, chunkAvg on average.
const (
	chunkMin  = 16 << 10
	chunkAvg  = 64 << 10
	chunkMax  = 256 << 10
	chunkMask = chunkAvg - 1
)

// gear is the rolling hash's table: fixed, so that the same bytes are cut
// the same way by every hutch.
var gear = func() (t [256]uint64) {
	x := uint64(0x9e3779b97f4a7c15)
	for i := range t {
		// splitmix64
		x += 0x9e3779b97f4a7c15
		z := x
		z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
		z = (z ^ (z >> 27)) * 0x94d049bb133111eb
		t[i] = z ^ (z >> 31)
	}
	return t
}()

// cut returns the length of the chunk that b begins with: where the
// rolling hash's low bits are all zero after chunkMin bytes, else
// chunkMax, else all of b (at the end of a file).
func cut(b []byte) int {
	if len(b) <= chunkMin {
		return len(b)
	}
	end := min(len(b), chunkMax)
	var h uint64
	for i := chunkMin; i < end; i++ {
		h = (h << 1) + gear[b[i]]
		if h&chunkMask == 0 {
			return i + 1
		}
	}
	return end
}

// ChunkRef is one chunk of a file: its SHA-256 (hex) and size.
type ChunkRef struct {
	Sum  string `json:"sha256"`
	Size int64  `json:"size"`
}

// ChunkedFile is a checkpoint file as chunks, in order.
type ChunkedFile struct {
	Name   string     `json:"name"`
	Size   int64      `json:"size"`
	Chunks []ChunkRef `json:"chunks"`
}

// ChunkIndex is a checkpoint's chunks.json.
type ChunkIndex struct {
	Files []ChunkedFile `json:"files"`
	// New is the bytes of the chunks this checkpoint added to the store
	// when it was chunked: what it costs beyond the checkpoints before.
	New int64 `json:"new"`
}

func (s *Store) chunksDir() string { return filepath.Join(s.root, "chunks") }

func (s *Store) chunkPath(sum string) string { return filepath.Join(s.chunksDir(), sum[:2], sum) }

func (s *Store) chunkIndexPath(d digest.Digest) string {
	return filepath.Join(s.checkpointPath(d), "chunks.json")
}

// validSum reports whether sum is a lowercase SHA-256 in hex.
func validSum(sum string) bool {
	if len(sum) != 64 {
		return false
	}
	for _, c := range sum {
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}

// CheckpointChunks is checkpoint d's chunk index, and false if it has not
// been chunked.
func (s *Store) CheckpointChunks(d digest.Digest) (ChunkIndex, bool, error) {
	if err := d.Validate(); err != nil {
		return ChunkIndex{}, false, fmt.Errorf("checkpoint digest %q: %v: %w", d, err, errdefs.ErrInvalidArgument)
	}
	return readChunkIndex(s.chunkIndexPath(d), d)
}

func readChunkIndex(p string, d digest.Digest) (ChunkIndex, bool, error) {
	b, err := os.ReadFile(p)
	if errors.Is(err, fs.ErrNotExist) {
		return ChunkIndex{}, false, nil
	}
	if err != nil {
		return ChunkIndex{}, false, err
	}
	var idx ChunkIndex
	if err := json.Unmarshal(b, &idx); err != nil {
		return ChunkIndex{}, false, fmt.Errorf("checkpoint %s: %s: %v: %w", d.Encoded()[:12], filepath.Base(p), err, ErrCorrupt)
	}
	for _, f := range idx.Files {
		for _, c := range f.Chunks {
			if !validSum(c.Sum) || c.Size <= 0 || c.Size > chunkMax {
				return ChunkIndex{}, false, fmt.Errorf("checkpoint %s: %s names a bad chunk: %w", d.Encoded()[:12], filepath.Base(p), ErrCorrupt)
			}
		}
	}
	return idx, true, nil
}

// CheckpointWhole reports whether checkpoint d's files are on disk whole
// (not evicted).
func (s *Store) CheckpointWhole(d digest.Digest) bool {
	_, err := os.Stat(filepath.Join(s.checkpointPath(d), "image"))
	return err == nil
}

// ChunkCheckpoint cuts every file of checkpoint d into chunks, stores
// those the store lacks, and records them (chunks.json). It does nothing
// for a checkpoint chunked already, and returns its index.
func (s *Store) ChunkCheckpoint(ctx context.Context, d digest.Digest) (ChunkIndex, error) {
	if idx, ok, err := s.CheckpointChunks(d); err != nil || ok {
		return idx, err
	}
	ck, err := s.readCheckpoint(d)
	if err != nil {
		return ChunkIndex{}, err
	}
	gc, err := lockPath(s.gcLockPath(), unix.LOCK_SH)
	if err != nil {
		return ChunkIndex{}, err
	}
	defer gc.Unlock()
	if err := os.MkdirAll(s.chunksDir(), 0o700); err != nil {
		return ChunkIndex{}, err
	}
	var idx ChunkIndex
	buf := make([]byte, 4*chunkMax)
	for _, f := range ck.Files {
		cf, n, err := s.chunkFile(filepath.Join(s.checkpointPath(d), "image", f.Name), buf)
		if err != nil {
			return ChunkIndex{}, fmt.Errorf("chunk checkpoint %s: %s: %w", d.Encoded()[:12], f.Name, err)
		}
		if cf.Size != f.Size {
			return ChunkIndex{}, fmt.Errorf("chunk checkpoint %s: %s is %d bytes, its manifest says %d: %w", d.Encoded()[:12], f.Name, cf.Size, f.Size, ErrCorrupt)
		}
		cf.Name = f.Name
		idx.Files = append(idx.Files, cf)
		idx.New += n
	}
	b, err := json.Marshal(idx)
	if err != nil {
		return ChunkIndex{}, err
	}
	if err := writeFileAtomic(s.chunkIndexPath(d), b, 0o600); err != nil {
		return ChunkIndex{}, err
	}
	return idx, nil
}

// chunkFile stores the chunks of file p and returns them, with the bytes
// of those that were new.
func (s *Store) chunkFile(p string, buf []byte) (ChunkedFile, int64, error) {
	f, err := os.Open(p)
	if err != nil {
		return ChunkedFile{}, 0, err
	}
	defer f.Close()
	return s.chunkStream(f, buf)
}

// chunkStream stores the chunks of what f reads and returns them, with
// the bytes of those that were new.
func (s *Store) chunkStream(f io.Reader, buf []byte) (ChunkedFile, int64, error) {
	var cf ChunkedFile
	var fresh int64
	n := 0 // bytes in buf
	eof := false
	for {
		if !eof && n < chunkMax {
			m, err := io.ReadFull(f, buf[n:])
			n += m
			if err == io.EOF || err == io.ErrUnexpectedEOF {
				eof = true
			} else if err != nil {
				return ChunkedFile{}, 0, err
			}
		}
		if n == 0 {
			return cf, fresh, nil
		}
		l := cut(buf[:n])
		sum := sha256.Sum256(buf[:l])
		h := hex.EncodeToString(sum[:])
		added, err := s.putChunk(h, buf[:l])
		if err != nil {
			return ChunkedFile{}, 0, err
		}
		if added {
			fresh += int64(l)
		}
		cf.Chunks = append(cf.Chunks, ChunkRef{Sum: h, Size: int64(l)})
		cf.Size += int64(l)
		n = copy(buf, buf[l:n])
	}
}

// putChunk stores chunk data under sum unless it is there, and reports
// whether it stored it.
func (s *Store) putChunk(sum string, data []byte) (bool, error) {
	p := s.chunkPath(sum)
	if _, err := os.Stat(p); err == nil {
		return false, nil
	}
	if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
		return false, err
	}
	tmp := p + ".tmp-" + randomHex()
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		os.Remove(tmp)
		return false, err
	}
	if err := os.Rename(tmp, p); err != nil {
		os.Remove(tmp)
		return false, err
	}
	return true, nil
}

// EvictCheckpoint removes the whole files of chunked checkpoint d; the
// next OpenCheckpoint makes them again from its chunks. The caller makes
// sure that nothing reads them meanwhile (a restore from d).
func (s *Store) EvictCheckpoint(ctx context.Context, d digest.Digest) error {
	if _, ok, err := s.CheckpointChunks(d); err != nil || !ok {
		if err == nil {
			err = fmt.Errorf("checkpoint %s is not chunked: %w", d.Encoded()[:12], errdefs.ErrFailedPrecondition)
		}
		return err
	}
	dir := filepath.Join(s.checkpointPath(d), "image")
	q := filepath.Join(s.checkpointPath(d), ".evict-"+randomHex())
	if err := os.Rename(dir, q); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		return err
	}
	return removeTree(q)
}

// rebuild makes the whole files of evicted checkpoint ck again from its
// chunks, checking each chunk's SHA-256. The caller then verifies them
// against the manifest.
func (s *Store) rebuild(ck Checkpoint) error {
	idx, ok, err := s.CheckpointChunks(ck.Digest)
	if err != nil {
		return err
	}
	if !ok {
		return fmt.Errorf("checkpoint %s has neither its files nor chunks: %w", ck.Digest.Encoded()[:12], ErrCorrupt)
	}
	gc, err := lockPath(s.gcLockPath(), unix.LOCK_SH)
	if err != nil {
		return err
	}
	defer gc.Unlock()
	tmp, err := os.MkdirTemp(s.checkpointPath(ck.Digest), ".rebuild-")
	if err != nil {
		return err
	}
	defer removeTree(tmp) //nolint:errcheck // gone once renamed
	for _, f := range idx.Files {
		if strings.ContainsAny(f.Name, "/\x00") || f.Name == "." || f.Name == ".." {
			return fmt.Errorf("checkpoint %s: chunks.json names file %q: %w", ck.Digest.Encoded()[:12], f.Name, ErrCorrupt)
		}
		if err := s.rebuildFile(filepath.Join(tmp, f.Name), f); err != nil {
			return fmt.Errorf("checkpoint %s: %s: %w", ck.Digest.Encoded()[:12], f.Name, err)
		}
	}
	if err := os.Rename(tmp, filepath.Join(s.checkpointPath(ck.Digest), "image")); err != nil && !s.CheckpointWhole(ck.Digest) {
		return err
	}
	return nil
}

// rebuildFile writes file p from f's chunks, on every CPU: each worker
// takes every n-th run of chunks and writes it at its offset.
func (s *Store) rebuildFile(p string, f ChunkedFile) error {
	out, err := os.OpenFile(p, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	defer out.Close()
	if err := out.Truncate(f.Size); err != nil {
		return err
	}
	offsets := make([]int64, len(f.Chunks))
	var off int64
	for i, c := range f.Chunks {
		offsets[i] = off
		off += c.Size
	}
	if off != f.Size {
		return fmt.Errorf("its chunks hold %d bytes, it has %d: %w", off, f.Size, ErrCorrupt)
	}
	// Runs of rebuildRun chunks: large enough writes, spread evenly.
	const rebuildRun = 64
	workers := max(1, min(runtime.NumCPU(), (len(f.Chunks)+rebuildRun-1)/rebuildRun))
	errs := make([]error, workers)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			buf := make([]byte, rebuildRun*chunkMax)
			for first := w * rebuildRun; first < len(f.Chunks); first += workers * rebuildRun {
				last := min(first+rebuildRun, len(f.Chunks))
				n := 0
				for _, c := range f.Chunks[first:last] {
					b, err := s.readChunk(c, buf[n:])
					if err != nil {
						errs[w] = err
						return
					}
					n += len(b)
				}
				if _, err := out.WriteAt(buf[:n], offsets[first]); err != nil {
					errs[w] = err
					return
				}
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	return out.Close()
}

// PruneChunks removes the chunks no stored checkpoint names, and returns
// the bytes freed. It waits for chunking and rebuilds in progress.
func (s *Store) PruneChunks(ctx context.Context) (int64, error) {
	l, err := lockPath(s.gcLockPath(), unix.LOCK_EX)
	if err != nil {
		return 0, err
	}
	defer l.Unlock()
	return s.pruneChunksLocked(ctx)
}

func (s *Store) pruneChunksLocked(ctx context.Context) (int64, error) {
	dirs, err := os.ReadDir(s.chunksDir())
	if errors.Is(err, fs.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	used := map[string]bool{}
	cks, err := s.Checkpoints(ctx)
	if err != nil {
		return 0, err
	}
	for _, ck := range cks {
		for _, read := range []func(digest.Digest) (ChunkIndex, bool, error){s.CheckpointChunks, s.CheckpointFiles} {
			idx, ok, err := read(ck.Digest)
			if err != nil {
				// A chunk it may name must not go: keep everything.
				return 0, err
			}
			if !ok {
				continue
			}
			for _, f := range idx.Files {
				for _, c := range f.Chunks {
					used[c.Sum] = true
				}
			}
		}
	}
	var freed int64
	for _, d := range dirs {
		ents, err := os.ReadDir(filepath.Join(s.chunksDir(), d.Name()))
		if err != nil {
			continue
		}
		for _, e := range ents {
			if used[e.Name()] {
				continue
			}
			p := filepath.Join(s.chunksDir(), d.Name(), e.Name())
			if fi, err := e.Info(); err == nil {
				freed += fi.Size()
			}
			if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
				log.G(ctx).WithError(err).WithField("path", p).Warn("remove a chunk")
			}
		}
	}
	return freed, nil
}

// filesIndexName is the file, beside a checkpoint's manifest, that lists
// the chunks of its files layer (AddCheckpointFiles).
const filesIndexName = "files.json"

// AddCheckpointFiles cuts layer r (an uncompressed layer tar: the
// sandbox's files at the checkpoint) into chunks stored once, and records
// them with the checkpoint being written, which collection then keeps.
// It returns the layer as chunks and the bytes of those that were new.
func (ci *CheckpointIngest) AddCheckpointFiles(r io.Reader) (ChunkedFile, int64, error) {
	if ci.done {
		return ChunkedFile{}, 0, fmt.Errorf("checkpoint ingest already finished: %w", errdefs.ErrFailedPrecondition)
	}
	if err := os.MkdirAll(ci.s.chunksDir(), 0o700); err != nil {
		return ChunkedFile{}, 0, err
	}
	cf, n, err := ci.s.chunkStream(r, make([]byte, 4*chunkMax))
	if err != nil {
		return ChunkedFile{}, 0, err
	}
	cf.Name = "files.tar"
	b, err := json.Marshal(ChunkIndex{Files: []ChunkedFile{cf}, New: n})
	if err != nil {
		return ChunkedFile{}, 0, err
	}
	if err := os.WriteFile(filepath.Join(ci.tmp, filesIndexName), b, 0o600); err != nil {
		return ChunkedFile{}, 0, err
	}
	return cf, n, nil
}

// CheckpointFiles is the files layer recorded with checkpoint d
// (AddCheckpointFiles), as chunks, and false if it has none.
func (s *Store) CheckpointFiles(d digest.Digest) (ChunkIndex, bool, error) {
	if err := d.Validate(); err != nil {
		return ChunkIndex{}, false, fmt.Errorf("checkpoint digest %q: %v: %w", d, err, errdefs.ErrInvalidArgument)
	}
	return readChunkIndex(filepath.Join(s.checkpointPath(d), filesIndexName), d)
}

// OpenCheckpointFiles returns the files layer of checkpoint d, checking
// each chunk's SHA-256 as it is read. Collection waits until it is closed.
func (s *Store) OpenCheckpointFiles(ctx context.Context, d digest.Digest) (io.ReadCloser, error) {
	idx, ok, err := s.CheckpointFiles(d)
	if err != nil {
		return nil, err
	}
	if !ok || len(idx.Files) != 1 {
		return nil, fmt.Errorf("checkpoint %s has no files layer: %w", d.Encoded()[:12], errdefs.ErrNotFound)
	}
	gc, err := lockPath(s.gcLockPath(), unix.LOCK_SH)
	if err != nil {
		return nil, err
	}
	pr, pw := io.Pipe()
	go func() {
		defer gc.Unlock()
		buf := make([]byte, chunkMax)
		for _, c := range idx.Files[0].Chunks {
			b, err := s.readChunk(c, buf)
			if err == nil {
				_, err = pw.Write(b)
			}
			if err != nil {
				pw.CloseWithError(err)
				return
			}
		}
		pw.Close()
	}()
	return pr, nil
}

// readChunk reads chunk c into buf, checking its size and SHA-256.
func (s *Store) readChunk(c ChunkRef, buf []byte) ([]byte, error) {
	in, err := os.Open(s.chunkPath(c.Sum))
	if err != nil {
		return nil, fmt.Errorf("chunk %s: %v: %w", c.Sum[:12], err, ErrCorrupt)
	}
	defer in.Close()
	n, err := io.ReadFull(in, buf[:c.Size])
	extra, _ := in.Read(buf[c.Size:min(len(buf), int(c.Size)+1)])
	if err != nil || extra != 0 {
		return nil, fmt.Errorf("chunk %s is not %d bytes: %w", c.Sum[:12], c.Size, ErrCorrupt)
	}
	if sum := sha256.Sum256(buf[:n]); hex.EncodeToString(sum[:]) != c.Sum {
		return nil, fmt.Errorf("chunk %s does not match its SHA-256: %w", c.Sum[:12], ErrCorrupt)
	}
	return buf[:n], nil
}
