// Package ptywire is the framing of a terminal's input between the host
// and the sandbox's agent ("hutch-init pty"). The agent runs a command on a
// pty of the sandbox's own devpts and copies the pty's output, as it is,
// to its stdout; its stdin carries frames from the host: what is typed,
// the terminal's size when it changes, and signals for the command.
//
// A frame is a kind byte, a payload length (2 bytes, big endian) and the
// payload: typed bytes for KindData (at most MaxData), rows and columns
// (2 bytes each, big endian) for KindResize, the signal number (1 byte,
// 1 to 64) for KindSignal.
package ptywire

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"sync"
)

// Kind is a frame's kind.
type Kind byte

// Frame kinds.
const (
	KindData   Kind = 'd'
	KindResize Kind = 'w'
	KindSignal Kind = 's'
)

// MaxData is the largest payload of a data frame; Writer.Data splits
// longer input.
const MaxData = 32 << 10

// MaxSignal is the highest signal number a frame carries.
const MaxSignal = 64

// ErrMalformed is returned for a frame that breaks the framing.
var ErrMalformed = errors.New("malformed terminal frame")

// Frame is one frame.
type Frame struct {
	Kind Kind
	// Data: what was typed.
	Data []byte
	// Resize: the terminal's size in character cells.
	Rows, Cols uint16
	// Signal: the signal number.
	Signal int
}

// Append appends f's encoding to b.
func Append(b []byte, f Frame) ([]byte, error) {
	switch f.Kind {
	case KindData:
		if len(f.Data) > MaxData {
			return b, fmt.Errorf("%w: %d bytes of data, at most %d", ErrMalformed, len(f.Data), MaxData)
		}
		b = append(b, byte(KindData))
		b = binary.BigEndian.AppendUint16(b, uint16(len(f.Data)))
		return append(b, f.Data...), nil
	case KindResize:
		b = append(b, byte(KindResize), 0, 4)
		b = binary.BigEndian.AppendUint16(b, f.Rows)
		return binary.BigEndian.AppendUint16(b, f.Cols), nil
	case KindSignal:
		if f.Signal < 1 || f.Signal > MaxSignal {
			return b, fmt.Errorf("%w: signal %d", ErrMalformed, f.Signal)
		}
		return append(b, byte(KindSignal), 0, 1, byte(f.Signal)), nil
	}
	return b, fmt.Errorf("%w: kind %q", ErrMalformed, byte(f.Kind))
}

// Writer writes frames; its methods are safe for concurrent use.
type Writer struct {
	mu sync.Mutex // guards w
	w  io.Writer
}

// NewWriter returns a Writer on w.
func NewWriter(w io.Writer) *Writer { return &Writer{w: w} }

// Write writes one frame.
func (w *Writer) Write(f Frame) error {
	b, err := Append(nil, f)
	if err != nil {
		return err
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	_, err = w.w.Write(b)
	return err
}

// Data writes p as data frames.
func (w *Writer) Data(p []byte) error {
	for len(p) > 0 {
		n := min(len(p), MaxData)
		if err := w.Write(Frame{Kind: KindData, Data: p[:n]}); err != nil {
			return err
		}
		p = p[n:]
	}
	return nil
}

// Resize writes a resize frame.
func (w *Writer) Resize(rows, cols uint16) error {
	return w.Write(Frame{Kind: KindResize, Rows: rows, Cols: cols})
}

// Signal writes a signal frame.
func (w *Writer) Signal(sig int) error {
	return w.Write(Frame{Kind: KindSignal, Signal: sig})
}

// Reader reads frames.
type Reader struct {
	r *bufio.Reader
}

// NewReader returns a Reader on r.
func NewReader(r io.Reader) *Reader { return &Reader{r: bufio.NewReaderSize(r, MaxData+3)} }

// Next reads the next frame. At the end of the input between frames it
// returns io.EOF; a frame cut short is io.ErrUnexpectedEOF; a frame that
// breaks the framing is ErrMalformed. A data frame's Data is valid until
// the next call.
func (r *Reader) Next() (Frame, error) {
	var hdr [3]byte
	if _, err := io.ReadFull(r.r, hdr[:]); err != nil {
		return Frame{}, err
	}
	kind, n := Kind(hdr[0]), int(binary.BigEndian.Uint16(hdr[1:]))
	switch {
	case kind != KindData && kind != KindResize && kind != KindSignal:
		return Frame{}, fmt.Errorf("%w: kind %q", ErrMalformed, byte(kind))
	case kind == KindData && n > MaxData,
		kind == KindResize && n != 4,
		kind == KindSignal && n != 1:
		return Frame{}, fmt.Errorf("%w: kind %q with %d bytes", ErrMalformed, byte(kind), n)
	}
	payload, err := r.r.Peek(n)
	if err != nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return Frame{}, err
	}
	r.r.Discard(n) //nolint:errcheck // the bytes were peeked
	f := Frame{Kind: kind}
	switch kind {
	case KindData:
		f.Data = payload
	case KindResize:
		f.Rows, f.Cols = binary.BigEndian.Uint16(payload), binary.BigEndian.Uint16(payload[2:])
	case KindSignal:
		f.Signal = int(payload[0])
		if f.Signal < 1 || f.Signal > MaxSignal {
			return Frame{}, fmt.Errorf("%w: signal %d", ErrMalformed, f.Signal)
		}
	}
	return f, nil
}
