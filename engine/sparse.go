package engine

import (
	"archive/tar"
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"strings"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"

	"hutch.dev/hutch/agent/archive"
	"hutch.dev/hutch/agent/wire"
	"hutch.dev/hutch/policy"
)

// A sandbox's writable layer holds at most --disk bytes of data, but a
// sparse file's apparent size costs it nothing (`truncate -s 1T f`).
// gVisor's export of the layer reads each file whole into the sentry's
// memory and writes its apparent size; the layer would then be unpacked
// on the host at that size. So a snapshot refuses a sandbox holding a
// file larger than its --disk that its image does not hold at that size,
// and counts the exported data against --disk; `hutch cp` out refuses a
// file larger than copyOutFloor and --disk (docs/decisions/0017).

// copyOutFloor is the apparent size `hutch cp` out always allows, whatever
// --disk: the zeros of a sparse file cross the pipe at about 5 s per GiB.
const copyOutFloor = 4 << 30

// errTooLarge reports a file whose apparent size its sandbox's --disk
// cannot hold.
func errTooLarge(op, p string, size, limit int64) error {
	return fmt.Errorf("%s: %w", op, errFileTooLarge(p, size, limit))
}

func errFileTooLarge(p string, size, limit int64) error {
	return fmt.Errorf("%s is %s (its apparent size), more than the sandbox's --disk %s can hold: a sparse file that large is not exported to the host; remove or shrink it: %w",
		p, policy.FormatSize(size), policy.FormatSize(limit), errdefs.ErrFailedPrecondition)
}

// lowerSize is the size of the regular file at sandbox path p in sb's
// image (its read-only rootfs on the host), or 0. p is resolved inside the
// rootfs, never following a symlink out of it.
func lowerSize(sb *record, p string) int64 {
	if sb.Rootfs == "" {
		return 0
	}
	root, err := unix.Open(sb.Rootfs, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return 0
	}
	defer unix.Close(root)
	fd, err := unix.Openat2(root, strings.TrimPrefix(path.Clean("/"+p), "/"), &unix.OpenHow{
		Flags:   unix.O_PATH | unix.O_NOFOLLOW | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_MAGICLINKS,
	})
	if err != nil {
		return 0
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if unix.Fstat(fd, &st) != nil || st.Mode&unix.S_IFMT != unix.S_IFREG {
		return 0
	}
	return st.Size
}

// checkLargeFiles refuses a snapshot of sb when its filesystem holds a
// regular file larger than its --disk and than its image's file at that
// path. It runs before the export of a sentry that holds each file whole
// while it exports it (one without tools/runsc/tarstream.patch), which
// would otherwise allocate the file's apparent size. A sentry that
// exports in pieces needs no scan: the export's own check (limitCheck)
// stops at the header of such a file.
func (e *Engine) checkLargeFiles(ctx context.Context, sb *record) error {
	if sb.Disk <= 0 || e.runscFor(sb).ExportsInPieces(sb.ID) {
		return nil
	}
	var out limitedBuffer
	out.max = 1 << 20
	var errBuf capBuffer
	p, err := e.agentProcess(ctx, sb, []string{wire.ModeLargeFiles, fmt.Sprint(sb.Disk)}, nil, &out, &errBuf)
	if err != nil {
		return err
	}
	if err := agentWait(ctx, sb, p, &errBuf); err != nil {
		return fmt.Errorf("look for sparse files: %w", err)
	}
	files, err := wire.ParseLargeFiles(out.Bytes())
	if err != nil {
		return err
	}
	for _, f := range files {
		if f.Size > lowerSize(sb, f.Path) {
			return errTooLarge("snapshot", f.Path, f.Size, sb.Disk)
		}
	}
	return nil
}

// upperExport is a running export of a sandbox's upper layer (what `runsc
// tar rootfs-upper` writes), its tar arriving on r.
type upperExport struct {
	r      *os.File
	cancel context.CancelFunc
	// fifo is the FIFO runsc writes into, or "".
	fifo string
	// exited is closed once the export has ended (the call on the
	// control socket returned, or runsc exited), err set before.
	exited chan struct{}
	err    error
}

// startUpperExport starts the export of sb's upper layer. The caller
// reads it, then calls wait (the whole tar read) or close.
//
// A running sandbox is asked over its control socket, as `runsc tar
// rootfs-upper` would ask it, to write into a pipe of ours: no runsc
// process to start (about 9 ms). Otherwise runsc writes into a FIFO.
func (e *Engine) startUpperExport(ctx context.Context, sb *record) (*upperExport, error) {
	r := e.runscFor(sb)
	if !r.HasControl(sb.ID) {
		return e.startUpperExportFIFO(ctx, sb)
	}
	pr, pw, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	setPipeSize(pr)
	ctx, cancel := context.WithCancel(ctx)
	x := &upperExport{r: pr, cancel: cancel, exited: make(chan struct{})}
	go func() {
		err := r.TarRootfsUpperTo(ctx, sb.ID, pw)
		// The sandbox closed its copy when it was done: the reader sees
		// the end once this one goes too.
		pw.Close()
		if err != nil {
			x.err = fmt.Errorf("export filesystem changes: %w", err)
		}
		close(x.exited)
	}()
	return x, nil
}

// setPipeSize gives the pipe read by r a buffer of upperPipeSize. A larger
// buffer is only faster; the default still works.
func setPipeSize(r *os.File) {
	if rc, err := r.SyscallConn(); err == nil {
		rc.Control(func(fd uintptr) { unix.FcntlInt(fd, unix.F_SETPIPE_SZ, upperPipeSize) }) //nolint:errcheck // see above
	}
}

// startUpperExportFIFO is startUpperExport through `runsc tar
// rootfs-upper` and a FIFO.
func (e *Engine) startUpperExportFIFO(ctx context.Context, sb *record) (*upperExport, error) {
	// runsc opens the file by name: a FIFO in the sandbox's directory.
	// Not our pipe's end by /proc/PID/fd: a rootless sandbox's runsc may
	// run in a user namespace of its own, which may not open the fds of
	// a process outside it. hold, a writer of ours, keeps the reader
	// from an end of file before runsc opens the FIFO; closed once runsc
	// has exited, it lets the reader see the end after the last byte.
	fifo := filepath.Join(e.sandboxDir(sb.ID), "upper.fifo")
	os.Remove(fifo) //nolint:errcheck // a leftover, if any
	if err := unix.Mkfifo(fifo, 0o600); err != nil {
		return nil, fmt.Errorf("export filesystem changes: %w", err)
	}
	hold, err := os.OpenFile(fifo, os.O_RDWR, 0)
	if err != nil {
		os.Remove(fifo)
		return nil, err
	}
	pr, err := os.Open(fifo)
	if err != nil {
		hold.Close()
		os.Remove(fifo)
		return nil, err
	}
	setPipeSize(pr)
	ctx, cancel := context.WithCancel(ctx)
	x := &upperExport{r: pr, cancel: cancel, fifo: fifo, exited: make(chan struct{})}
	go func() {
		err := e.runscFor(sb).TarRootfsUpper(ctx, sb.ID, fifo)
		hold.Close()
		if err != nil {
			x.err = fmt.Errorf("export filesystem changes: %w", err)
		}
		close(x.exited)
	}()
	return x, nil
}

// wait waits for runsc to exit once its tar has been read to the end, and
// returns its error. It may run beside close.
func (x *upperExport) wait() error {
	<-x.exited
	return x.err
}

// close ends the export, stopping runsc if it still runs. It returns
// runsc's error if runsc had failed before the export was closed: the
// cause of a tar cut short.
func (x *upperExport) close() error {
	var failed error
	select {
	case <-x.exited:
		failed = x.err
	default:
	}
	x.r.Close() // runsc's writes fail from here on
	x.cancel()
	<-x.exited
	if x.fifo != "" {
		os.Remove(x.fifo)
	}
	return failed
}

// exportUpper writes sb's upper layer to tmp, stopping the export as soon
// as its regular files add up to more than --disk (limitCheck).
func (e *Engine) exportUpper(ctx context.Context, sb *record, tmp *os.File) error {
	x, err := e.startUpperExport(ctx, sb)
	if err != nil {
		return err
	}
	bw := bufio.NewWriterSize(tmp, upperBufSize)
	rerr := copyUpper(bw, bufio.NewReaderSize(x.r, upperBufSize), limitCheck(sb.Disk))
	if rerr == nil {
		rerr = bw.Flush()
	}
	if rerr == nil {
		rerr = x.wait()
	}
	if failed := x.close(); failed != nil {
		return failed
	}
	return rerr
}

// upperPipeSize is the pipe buffer between `runsc tar rootfs-upper` and
// hutch, and upperBufSize the size of hutch's reads from it and writes to the
// temporary file: with the default 64 KiB pipe and tar's 8 KiB reads, 100
// MiB of changes cost some 13,000 reads, as many writes and a switch
// between runsc and hutch every 64 KiB, which on a busy host cost more than
// the copy itself (docs/decisions/0018).
const (
	upperPipeSize = 1 << 20
	upperBufSize  = 1 << 20
)

// limitCheck returns a check of the headers of an exported upper layer
// that fails once its regular files add up to more than limit bytes
// (limit <= 0: no limit): only sparse files can, and the host's disk must
// not receive their apparent size.
func limitCheck(limit int64) func(*tar.Header) error {
	var total int64
	return func(hdr *tar.Header) error {
		if hdr.Typeflag != tar.TypeReg {
			return nil
		}
		if limit > 0 && hdr.Size > limit {
			return errFileTooLarge(path.Clean("/"+hdr.Name), hdr.Size, limit)
		}
		total += hdr.Size
		if limit > 0 && total > limit {
			return fmt.Errorf("the sandbox's files add up to more than its --disk %s (sparse files?); remove or shrink them: %w",
				policy.FormatSize(limit), errdefs.ErrFailedPrecondition)
		}
		return nil
	}
}

// copyUpper copies the upper layer tar r to w, checking each header with
// check before its data is copied.
func copyUpper(w io.Writer, r io.Reader, check func(*tar.Header) error) error {
	tee := io.TeeReader(r, w)
	tr := tar.NewReader(tee)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return fmt.Errorf("read the exported layer: %w", err)
		}
		if err := check(hdr); err != nil {
			return err
		}
		if _, err := io.Copy(io.Discard, tr); err != nil {
			return fmt.Errorf("read the exported layer: %w", err)
		}
	}
	_, err := io.Copy(io.Discard, tee)
	return err
}

// copyOutCheck returns the header check of a copy of src out of sb:
// a regular file larger than copyOutFloor, --disk and its image's file is
// refused before any of it is read.
func copyOutCheck(sb *record, src string) func(*tar.Header) error {
	base := path.Dir(path.Clean(src))
	if archive.ArchiveName(src) == "." {
		base = path.Clean(src)
	}
	limit := max(sb.Disk, copyOutFloor)
	return func(h *tar.Header) error {
		if h.Typeflag != tar.TypeReg || h.Size <= limit {
			return nil
		}
		p := path.Join(base, h.Name)
		if h.Size <= lowerSize(sb, p) {
			return nil
		}
		return fmt.Errorf("copy: %s is %s (its apparent size), more than a copy out of this sandbox allows (%s: its --disk, and at least %s): a sparse file that large is not copied; remove or shrink it: %w",
			p, policy.FormatSize(h.Size), policy.FormatSize(limit), policy.FormatSize(copyOutFloor), errdefs.ErrFailedPrecondition)
	}
}

// limitedBuffer keeps the first max bytes written to it and fails past
// them.
type limitedBuffer struct {
	bytes.Buffer
	max int
}

func (b *limitedBuffer) Write(p []byte) (int, error) {
	if b.Len()+len(p) > b.max {
		return 0, fmt.Errorf("more than %d bytes of output: %w", b.max, errdefs.ErrOutOfRange)
	}
	return b.Buffer.Write(p)
}
