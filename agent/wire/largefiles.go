package wire

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"strconv"
)

// The host asks the agent ("hutch-init large-files LIMIT") for the
// sandbox's regular files larger than LIMIT bytes before it exports the
// sandbox's upper layer; the agent answers as WriteLargeFiles writes.

// MaxLargeFiles is the most files large-files reports.
const MaxLargeFiles = 32

// LargeFile is a regular file found by large-files.
type LargeFile struct {
	Path string
	Size int64
}

// WriteLargeFiles writes fs as records "SIZE PATH\x00".
func WriteLargeFiles(w io.Writer, files []LargeFile) error {
	bw := bufio.NewWriter(w)
	for _, f := range files {
		fmt.Fprintf(bw, "%d %s\x00", f.Size, f.Path)
	}
	return bw.Flush()
}

// ParseLargeFiles reads what WriteLargeFiles wrote. It comes from inside
// a sandbox: at most MaxLargeFiles records are accepted and a malformed
// one is an error.
func ParseLargeFiles(b []byte) ([]LargeFile, error) {
	var out []LargeFile
	for len(b) > 0 {
		rec, rest, ok := bytes.Cut(b, []byte{0})
		if !ok {
			return nil, fmt.Errorf("large-files: unterminated record")
		}
		b = rest
		sz, p, ok := bytes.Cut(rec, []byte{' '})
		n, err := strconv.ParseInt(string(sz), 10, 64)
		if !ok || err != nil || n < 0 || len(p) == 0 || p[0] != '/' {
			return nil, fmt.Errorf("large-files: malformed record %q", rec)
		}
		if len(out) == MaxLargeFiles {
			return nil, fmt.Errorf("large-files: more than %d records", MaxLargeFiles)
		}
		out = append(out, LargeFile{Path: string(p), Size: n})
	}
	return out, nil
}
