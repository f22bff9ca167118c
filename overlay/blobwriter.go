package overlay

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/opencontainers/go-digest"
	"golang.org/x/sys/unix"
)

// blobWriter stores one blob of a layer Commit writes. containerd's local
// writer hashes and writes in one goroutine and leaves all of the
// writeback to the fsync at its commit; a snapshot's layer spent about as
// long in that fsync as in the writes. blobWriter hashes on a goroutine of
// its own beside the writes (asyncDigester), and starts the writeback of
// every blobWritebackChunk written (sync_file_range), so that the fsync at
// commit finds little left to write (docs/decisions/0030).
//
// The blob is written in the store's tmp directory, and commit renames it
// to its path in the local content store's layout (oci/blobs/ALG/ENCODED),
// as containerd's writer does from its ingest directory. The caller holds
// the gc lock shared; an interrupted write leaves a file that garbage
// collection removes.
type blobWriter struct {
	f       *os.File
	digest  *asyncDigester
	n       int64
	flushed int64
}

// blobWritebackChunk is how much is written before its writeback starts.
const blobWritebackChunk = 8 << 20

func (s *Store) tmpDir() string { return filepath.Join(s.root, "tmp") }

func (s *Store) newBlobWriter() (*blobWriter, error) {
	if err := os.MkdirAll(s.tmpDir(), 0o700); err != nil {
		return nil, err
	}
	f, err := os.CreateTemp(s.tmpDir(), "blob-")
	if err != nil {
		return nil, err
	}
	return &blobWriter{f: f, digest: newAsyncDigester()}, nil
}

func (w *blobWriter) Write(p []byte) (int, error) {
	n, err := w.f.Write(p)
	w.digest.Write(p[:n]) //nolint:errcheck // never fails
	w.n += int64(n)
	if w.n-w.flushed >= blobWritebackChunk {
		// Only a start: the writes go on while the disk takes these.
		unix.SyncFileRange(int(w.f.Fd()), w.flushed, w.n-w.flushed, unix.SYNC_FILE_RANGE_WRITE) //nolint:errcheck // the fsync at commit reports
		w.flushed = w.n
	}
	return n, err
}

// commit syncs the blob and moves it to its digest's path in the content
// store, where a blob already there is kept. It returns the digest and
// size.
func (w *blobWriter) commit(s *Store) (digest.Digest, int64, error) {
	dgst := w.digest.Digest()
	// Read-only, as containerd's writer leaves its blobs.
	if err := w.f.Chmod(0o444); err != nil {
		w.abort()
		return "", 0, fmt.Errorf("store blob: %w", err)
	}
	if err := w.f.Sync(); err != nil {
		w.abort()
		return "", 0, fmt.Errorf("store blob: %w", err)
	}
	if err := w.f.Close(); err != nil {
		w.abort()
		return "", 0, fmt.Errorf("store blob: %w", err)
	}
	target := filepath.Join(s.ociDir(), "blobs", dgst.Algorithm().String(), dgst.Encoded())
	if _, err := os.Stat(target); err == nil {
		os.Remove(w.f.Name())
		return dgst, w.n, nil
	} else if !errors.Is(err, fs.ErrNotExist) {
		w.abort()
		return "", 0, err
	}
	if err := os.MkdirAll(filepath.Dir(target), 0o755); err != nil {
		w.abort()
		return "", 0, err
	}
	if err := os.Rename(w.f.Name(), target); err != nil {
		w.abort()
		return "", 0, fmt.Errorf("store blob: %w", err)
	}
	return dgst, w.n, nil
}

// abort removes what was written.
func (w *blobWriter) abort() {
	w.digest.Digest()
	w.f.Close()
	os.Remove(w.f.Name())
}
