package overlay

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"path"
	"sort"
	"strings"
	"time"

	"github.com/containerd/errdefs"
)

const (
	whiteoutPrefix = ".wh."
	whiteoutOpaque = ".wh..wh..opq"
	// xattrOverlay is the prefix of the xattrs gVisor's overlay keeps for
	// itself in the upper layer.
	xattrOverlay     = "SCHILY.xattr.trusted.overlay."
	xattrOpaque      = xattrOverlay + "opaque"
	paxXattrPrefixes = "SCHILY.xattr."
)

// SnapshotOptions describes a snapshot: a sandbox's upper layer committed on
// top of the image the sandbox runs.
type SnapshotOptions struct {
	// Name tags the new image.
	Name string
	// Parent is the image the sandbox runs.
	Parent Image
	// Upper is the tar `runsc tar rootfs-upper` wrote. It must be a
	// regular file: entries are read back by offset to sort them.
	Upper *os.File
	// Exclude lists absolute paths that never enter the layer, with
	// everything below them (e.g. "/run").
	Exclude []string
	// History is the created_by text of the new layer.
	History string
}

// Snapshot converts opts.Upper into a zstd-compressed OCI layer and commits
// it on top of opts.Parent as opts.Name. See the package's persistence
// contract for what the layer holds and what is guaranteed.
func (s *Store) Snapshot(ctx context.Context, opts SnapshotOptions) (Image, error) {
	if opts.Upper == nil {
		return Image{}, fmt.Errorf("snapshot: no upper layer: %w", errdefs.ErrInvalidArgument)
	}
	entries, err := readUpper(opts.Upper, opts.Exclude)
	if err != nil {
		return Image{}, fmt.Errorf("snapshot: read upper layer: %w", err)
	}
	pr, pw := io.Pipe()
	go func() {
		pw.CloseWithError(writeLayerTar(pw, opts.Upper, entries))
	}()
	parent := opts.Parent
	img, err := s.Commit(ctx, CommitOptions{Name: opts.Name, Parent: &parent, Layer: pr, History: opts.History, Compression: Zstd})
	pr.CloseWithError(errors.New("commit ended"))
	return img, err
}

// upperEntry is one entry of an upper layer tar: its OCI header and where
// its data starts in the tar file.
type upperEntry struct {
	hdr    *tar.Header
	offset int64
}

// countingReader counts the bytes read through it.
type countingReader struct {
	r io.Reader
	n int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

// Seek lets tar.Reader skip file data without reading it.
func (c *countingReader) Seek(off int64, whence int) (int64, error) {
	n, err := c.r.(io.Seeker).Seek(off, whence)
	if err == nil {
		c.n = n
	}
	return n, err
}

// readUpper reads the headers of gVisor's upper tar and returns them as OCI
// layer entries, sorted by path: whiteouts and opaque directories
// converted, excluded paths and the root directory dropped, and hard links
// pointing at the first (in sorted order) path of their inode.
func readUpper(f *os.File, exclude []string) ([]upperEntry, error) {
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return nil, err
	}
	cr := &countingReader{r: f}
	tr := tar.NewReader(cr)
	var out []upperEntry
	// gVisor writes every whiteout after the first as a hard link to it.
	whiteouts := map[string]bool{}
	// Special files made in the sandbox never enter a layer: unpacked on
	// the host they would be FIFOs that block whoever opens them and
	// device nodes that reach the host's devices. Hard links to them go
	// too.
	special := map[string]bool{}
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, err
		}
		name := cleanName(hdr.Name)
		if name == "" || excluded(name, exclude) {
			continue
		}
		h := normalizeHeader(hdr, name)
		switch {
		case hdr.Typeflag == tar.TypeChar && hdr.Devmajor == 0 && hdr.Devminor == 0,
			hdr.Typeflag == tar.TypeLink && whiteouts[cleanName(hdr.Linkname)]:
			// gVisor's (and overlayfs's) whiteout.
			whiteouts[name] = true
			dir, base := path.Split(name)
			h = &tar.Header{Typeflag: tar.TypeReg, Name: dir + whiteoutPrefix + base, ModTime: tarEpoch, Format: tar.FormatPAX}
		case hdr.Typeflag == tar.TypeFifo || hdr.Typeflag == tar.TypeChar || hdr.Typeflag == tar.TypeBlock,
			hdr.Typeflag == tar.TypeLink && special[cleanName(hdr.Linkname)]:
			special[name] = true
			slog.Warn("snapshot: leaving out a special file", "path", "/"+name, "type", string(hdr.Typeflag))
			continue
		case hdr.Typeflag == tar.TypeLink:
			h.Linkname = cleanName(hdr.Linkname)
		}
		out = append(out, upperEntry{hdr: h, offset: cr.n})
		if hdr.Typeflag == tar.TypeDir && hdr.PAXRecords[xattrOpaque] == "y" {
			out = append(out, upperEntry{hdr: &tar.Header{
				Typeflag: tar.TypeReg, Name: name + "/" + whiteoutOpaque, ModTime: tarEpoch, Format: tar.FormatPAX,
			}})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].hdr.Name < out[j].hdr.Name })
	relinkHardLinks(out)
	return out, nil
}

// relinkHardLinks makes the first path (in output order) of every hard
// link group the one that carries the data, and every other path a link to
// it carrying the same metadata (archive.Apply sets a link entry's
// metadata on the shared inode), so that no link precedes its target and
// the output does not depend on which path gVisor wrote first.
func relinkHardLinks(entries []upperEntry) {
	index := map[string]int{}
	for i, e := range entries {
		index[e.hdr.Name] = i
	}
	groups := map[int][]int{} // index of the data entry -> indexes of its links
	for i, e := range entries {
		if e.hdr.Typeflag != tar.TypeLink {
			continue
		}
		if t, ok := index[e.hdr.Linkname]; ok && entries[t].hdr.Typeflag != tar.TypeLink {
			groups[t] = append(groups[t], i)
		}
		// A link to nothing: archive.Apply reports it.
	}
	for t, links := range groups {
		data := entries[t]
		first := t
		for _, l := range links {
			if l < first {
				first = l
			}
		}
		members := append([]int{t}, links...)
		for _, m := range members {
			name := entries[m].hdr.Name
			h := *data.hdr
			h.Name = name
			if h.PAXRecords != nil {
				h.PAXRecords = maps.Clone(h.PAXRecords)
			}
			if m == first {
				entries[m] = upperEntry{hdr: &h, offset: data.offset}
				continue
			}
			h.Typeflag, h.Size, h.Linkname = tar.TypeLink, 0, ""
			entries[m] = upperEntry{hdr: &h}
		}
		for _, m := range members {
			if m != first {
				entries[m].hdr.Linkname = entries[first].hdr.Name
			}
		}
	}
}

// cleanName turns gVisor's "./a/b/" into "a/b"; the root is "".
func cleanName(n string) string {
	n = path.Clean("/" + n)
	return strings.TrimPrefix(n, "/")
}

func excluded(name string, exclude []string) bool {
	for _, x := range exclude {
		x = cleanName(x)
		if x == "" {
			continue
		}
		if name == x || strings.HasPrefix(name, x+"/") {
			return true
		}
		// A whiteout of an excluded path is excluded too.
		dir, base := path.Split(name)
		if strings.HasPrefix(base, whiteoutPrefix) && dir+strings.TrimPrefix(base, whiteoutPrefix) == x {
			return true
		}
	}
	return false
}

// normalizeHeader returns the header the layer gets for hdr: only what
// describes the file, in one format.
func normalizeHeader(hdr *tar.Header, name string) *tar.Header {
	h := &tar.Header{
		Typeflag: hdr.Typeflag,
		Name:     name,
		Linkname: hdr.Linkname,
		Size:     hdr.Size,
		Mode:     hdr.Mode,
		Uid:      hdr.Uid,
		Gid:      hdr.Gid,
		ModTime:  hdr.ModTime.UTC(),
		Devmajor: hdr.Devmajor,
		Devminor: hdr.Devminor,
		Format:   tar.FormatPAX,
	}
	if hdr.ModTime.IsZero() {
		h.ModTime = time.Unix(0, 0).UTC()
	}
	if h.Typeflag == tar.TypeDir {
		h.Name += "/"
	}
	if h.Typeflag != tar.TypeReg {
		h.Size = 0
	}
	for k, v := range hdr.PAXRecords {
		if strings.HasPrefix(k, paxXattrPrefixes) && !strings.HasPrefix(k, xattrOverlay) {
			if h.PAXRecords == nil {
				h.PAXRecords = map[string]string{}
			}
			h.PAXRecords[k] = v
		}
	}
	return h
}

// writeLayerTar writes entries as a tar to w, copying file data from the
// upper tar f.
func writeLayerTar(w io.Writer, f *os.File, entries []upperEntry) error {
	tw := tar.NewWriter(w)
	for _, e := range entries {
		if err := tw.WriteHeader(e.hdr); err != nil {
			return fmt.Errorf("%s: %w", e.hdr.Name, err)
		}
		if e.hdr.Typeflag == tar.TypeReg && e.hdr.Size > 0 {
			if _, err := io.Copy(tw, io.NewSectionReader(f, e.offset, e.hdr.Size)); err != nil {
				return fmt.Errorf("%s: %w", e.hdr.Name, err)
			}
		}
	}
	return tw.Close()
}
