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
// top of the image the sandbox runs. Exactly one of Upper and UpperStream
// is set.
type SnapshotOptions struct {
	// Name tags the new image.
	Name string
	// Parent is the image the sandbox runs.
	Parent Image
	// Upper is a tar `runsc tar rootfs-upper` wrote, its entries in any
	// order. It must be a regular file: entries are read back by offset
	// to sort them.
	Upper *os.File
	// UpperStream is such a tar with every directory's entries in name
	// order (what runsc built with tools/runsc/tarorder.patch writes). It
	// is converted and stored as it is read, giving the same layer as
	// Upper would. An entry out of that order fails the snapshot with
	// ErrUnordered, and nothing is stored.
	UpperStream io.Reader
	// Check, if set, sees each header of UpperStream before any of its
	// data is stored; an error fails the snapshot.
	Check func(*tar.Header) error
	// End, if set, is called once UpperStream has been read to its end,
	// before anything is tagged; an error fails the snapshot.
	End func() error
	// Exclude lists absolute paths that never enter the layer, with
	// everything below them (e.g. "/run").
	Exclude []string
	// History is the created_by text of the new layer.
	History string
}

// ErrUnordered is the error of a snapshot whose UpperStream is not in name
// order.
var ErrUnordered = errors.New("upper layer not in name order")

// Snapshot converts the sandbox's upper layer into an OCI layer
// (zstd-compressed unless it does not compress) and commits it on top of
// opts.Parent as opts.Name. See the package's persistence contract for
// what the layer holds and what is guaranteed.
func (s *Store) Snapshot(ctx context.Context, opts SnapshotOptions) (Image, error) {
	var produce func(io.Writer) error
	switch {
	case opts.Upper != nil && opts.UpperStream == nil:
		entries, err := readUpper(opts.Upper, opts.Exclude)
		if err != nil {
			return Image{}, fmt.Errorf("snapshot: read upper layer: %w", err)
		}
		produce = func(w io.Writer) error { return writeLayerTar(w, opts.Upper, entries) }
	case opts.UpperStream != nil && opts.Upper == nil:
		produce = func(w io.Writer) error {
			if err := streamLayerTar(w, opts.UpperStream, opts.Exclude, opts.Check); err != nil {
				return err
			}
			// What follows the archive's end (runsc's padding).
			if _, err := io.Copy(io.Discard, opts.UpperStream); err != nil {
				return err
			}
			if opts.End != nil {
				return opts.End()
			}
			return nil
		}
	default:
		return Image{}, fmt.Errorf("snapshot: give the upper layer as a file or a stream: %w", errdefs.ErrInvalidArgument)
	}
	pr, pw := io.Pipe()
	produced := make(chan error, 1)
	go func() {
		err := produce(pw)
		produced <- err
		pw.CloseWithError(err)
	}()
	parent := opts.Parent
	img, err := s.Commit(ctx, CommitOptions{Name: opts.Name, Parent: &parent, Layer: pr, History: opts.History, Compression: ZstdUnlessIncompressible})
	pr.CloseWithError(errors.New("commit ended"))
	if err != nil {
		// The conversion's own error, if that is what ended the commit
		// (it is sent before the commit can see it): it says what was
		// wrong with the upper layer without the commit's wrapping.
		select {
		case perr := <-produced:
			if perr != nil {
				return Image{}, perr
			}
		default:
		}
	}
	return img, err
}

// upperEntry is one entry of an upper layer tar: its OCI header, where
// its data starts in the tar file, and its place in the layer (orderKey).
type upperEntry struct {
	hdr    *tar.Header
	offset int64
	key    string
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
// layer entries in layer order (orderKey of gVisor's names, an opaque
// directory's marker first in it): whiteouts and opaque directories
// converted, excluded paths and the root directory dropped, and hard links
// pointing at the first (in layer order) path of their inode.
func readUpper(f *os.File, exclude []string) ([]upperEntry, error) {
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return nil, err
	}
	cr := &countingReader{r: f}
	tr := tar.NewReader(cr)
	c := newUpperConverter(exclude)
	var out []upperEntry
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, err
		}
		key := orderKey(cleanName(hdr.Name))
		for i, h := range c.convert(hdr) {
			e := upperEntry{hdr: h, offset: cr.n, key: key}
			if i > 0 {
				e.key = key + opaqueKeySuffix
			}
			out = append(out, e)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].key < out[j].key })
	relinkHardLinks(out)
	return out, nil
}

// orderKey is the sort key of a clean path name: byte order, but with '/'
// below every other byte, so that a directory's entries follow it and
// precede the next name after it. It is the order in which a walk
// visiting each directory's entries in name order finds them, the order
// of runsc's export with tools/runsc/tarorder.patch. Names hold no NUL.
func orderKey(name string) string {
	return strings.ReplaceAll(name, "/", "\x00")
}

// opaqueKeySuffix places an opaque directory's marker right after the
// directory, before its first entry.
const opaqueKeySuffix = "\x00\x00"

// upperConverter turns gVisor's upper tar headers into OCI layer headers.
// Headers must come in the order gVisor wrote them (whatever that is): a
// hard link after the path it links to.
type upperConverter struct {
	exclude []string
	// gVisor writes every whiteout after the first as a hard link to it.
	whiteouts map[string]bool
	// Special files made in the sandbox never enter a layer: unpacked on
	// the host they would be FIFOs that block whoever opens them and
	// device nodes that reach the host's devices. Hard links to them go
	// too.
	special map[string]bool
}

func newUpperConverter(exclude []string) *upperConverter {
	return &upperConverter{exclude: exclude, whiteouts: map[string]bool{}, special: map[string]bool{}}
}

// convert returns the layer headers for hdr: none, one, or a directory and
// its opaque marker. A hard link's Linkname is its target's clean name;
// its other fields are still to be filled (relinkHardLinks, or
// streamLayerTar).
func (c *upperConverter) convert(hdr *tar.Header) []*tar.Header {
	name := cleanName(hdr.Name)
	if name == "" || excluded(name, c.exclude) {
		return nil
	}
	h := normalizeHeader(hdr, name)
	switch {
	case hdr.Typeflag == tar.TypeChar && hdr.Devmajor == 0 && hdr.Devminor == 0,
		hdr.Typeflag == tar.TypeLink && c.whiteouts[cleanName(hdr.Linkname)]:
		// gVisor's (and overlayfs's) whiteout.
		c.whiteouts[name] = true
		dir, base := path.Split(name)
		h = &tar.Header{Typeflag: tar.TypeReg, Name: dir + whiteoutPrefix + base, ModTime: tarEpoch, Format: tar.FormatPAX}
	case hdr.Typeflag == tar.TypeFifo || hdr.Typeflag == tar.TypeChar || hdr.Typeflag == tar.TypeBlock,
		hdr.Typeflag == tar.TypeLink && c.special[cleanName(hdr.Linkname)]:
		c.special[name] = true
		slog.Warn("snapshot: leaving out a special file", "path", "/"+name, "type", string(hdr.Typeflag))
		return nil
	case hdr.Typeflag == tar.TypeLink && excluded(cleanName(hdr.Linkname), c.exclude):
		// Its data is in a path the layer leaves out.
		slog.Warn("snapshot: leaving out a hard link to a path snapshots leave out", "path", "/"+name, "target", "/"+cleanName(hdr.Linkname))
		return nil
	case hdr.Typeflag == tar.TypeLink:
		h.Linkname = cleanName(hdr.Linkname)
	}
	if hdr.Typeflag == tar.TypeDir && hdr.PAXRecords[xattrOpaque] == "y" {
		return []*tar.Header{h, {Typeflag: tar.TypeReg, Name: name + "/" + whiteoutOpaque, ModTime: tarEpoch, Format: tar.FormatPAX}}
	}
	return []*tar.Header{h}
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

// streamLayerTar writes the layer of gVisor's upper tar r to w as it reads
// it: the layer readUpper and writeLayerTar would give, provided every
// directory's entries come in name order (ErrUnordered otherwise). In that
// order the first path of a hard link group is the one gVisor wrote the
// data under, so links need no reordering. check sees every header of r
// before its data is read.
func streamLayerTar(w io.Writer, r io.Reader, exclude []string, check func(*tar.Header) error) error {
	tr := tar.NewReader(r)
	tw := tar.NewWriter(w)
	c := newUpperConverter(exclude)
	// The regular files written, by name: a hard link takes its target's
	// header.
	files := map[string]*tar.Header{}
	buf := make([]byte, streamCopySize)
	prev, started := "", false
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return err
		}
		if check != nil {
			if err := check(hdr); err != nil {
				return err
			}
		}
		key := orderKey(cleanName(hdr.Name))
		if started && key <= prev {
			return fmt.Errorf("%q after %q: %w", cleanName(hdr.Name), strings.ReplaceAll(prev, "\x00", "/"), ErrUnordered)
		}
		prev, started = key, true
		for _, h := range c.convert(hdr) {
			switch h.Typeflag {
			case tar.TypeLink:
				t, ok := files[h.Linkname]
				if !ok {
					return fmt.Errorf("%s: a hard link to %s, which the layer does not hold", h.Name, h.Linkname)
				}
				l := *t
				l.Name, l.Typeflag, l.Size, l.Linkname = h.Name, tar.TypeLink, 0, t.Name
				if l.PAXRecords != nil {
					l.PAXRecords = maps.Clone(l.PAXRecords)
				}
				h = &l
			case tar.TypeReg:
				files[h.Name] = h
			}
			if err := tw.WriteHeader(h); err != nil {
				return fmt.Errorf("%s: %w", h.Name, err)
			}
			if h.Typeflag == tar.TypeReg && h.Size > 0 {
				if _, err := io.CopyBuffer(tw, io.LimitReader(tr, h.Size), buf); err != nil {
					return fmt.Errorf("%s: %w", h.Name, err)
				}
			}
		}
	}
	return tw.Close()
}

// streamCopySize is the size of streamLayerTar's copies of file data.
const streamCopySize = 1 << 20
