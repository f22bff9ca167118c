package ptywire

import (
	"bytes"
	"errors"
	"io"
	"reflect"
	"testing"
)

func TestRoundTrip(t *testing.T) {
	var buf bytes.Buffer
	w := NewWriter(&buf)
	long := bytes.Repeat([]byte("x"), MaxData+10)
	if err := w.Data([]byte("ls\r")); err != nil {
		t.Fatal(err)
	}
	if err := w.Resize(45, 132); err != nil {
		t.Fatal(err)
	}
	if err := w.Signal(2); err != nil {
		t.Fatal(err)
	}
	if err := w.Data(long); err != nil {
		t.Fatal(err)
	}
	r := NewReader(&buf)
	want := []Frame{
		{Kind: KindData, Data: []byte("ls\r")},
		{Kind: KindResize, Rows: 45, Cols: 132},
		{Kind: KindSignal, Signal: 2},
		{Kind: KindData, Data: long[:MaxData]},
		{Kind: KindData, Data: long[MaxData:]},
	}
	for i, wf := range want {
		f, err := r.Next()
		if err != nil {
			t.Fatalf("frame %d: %v", i, err)
		}
		if !reflect.DeepEqual(f, wf) {
			t.Fatalf("frame %d: got %+v, want %+v", i, f.Kind, wf.Kind)
		}
	}
	if _, err := r.Next(); err != io.EOF {
		t.Fatalf("after the last frame: %v, want EOF", err)
	}
}

func TestMalformed(t *testing.T) {
	for name, in := range map[string][]byte{
		"unknown kind":     {'z', 0, 0},
		"short resize":     {'w', 0, 2, 0, 1},
		"signal zero":      {'s', 0, 1, 0},
		"signal too high":  {'s', 0, 1, 65},
		"data over max":    {'d', 0x80, 1},
		"signal too large": {'s', 0, 2, 1, 1},
	} {
		if _, err := NewReader(bytes.NewReader(in)).Next(); !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: %v, want ErrMalformed", name, err)
		}
	}
	if _, err := NewReader(bytes.NewReader([]byte{'d', 0, 5, 'a'})).Next(); err != io.ErrUnexpectedEOF {
		t.Errorf("a cut frame: %v, want ErrUnexpectedEOF", err)
	}
	for _, f := range []Frame{{Kind: 'z'}, {Kind: KindSignal, Signal: 0}, {Kind: KindSignal, Signal: 65}, {Kind: KindData, Data: make([]byte, MaxData+1)}} {
		if _, err := Append(nil, f); !errors.Is(err, ErrMalformed) {
			t.Errorf("Append(%q, signal %d, %d bytes): %v, want ErrMalformed", byte(f.Kind), f.Signal, len(f.Data), err)
		}
	}
}

// FuzzReader: any input decodes into frames or an error, never a panic,
// and every frame decoded encodes back to the bytes it came from.
func FuzzReader(f *testing.F) {
	f.Add([]byte{'d', 0, 3, 'l', 's', '\r', 'w', 0, 4, 0, 24, 0, 80, 's', 0, 1, 2})
	f.Add([]byte{'w', 0, 4, 0xff, 0xff})
	f.Add([]byte{'d', 0x80, 0})
	f.Fuzz(func(t *testing.T, in []byte) {
		r := NewReader(bytes.NewReader(in))
		off := 0
		for {
			fr, err := r.Next()
			if err != nil {
				return
			}
			b, err := Append(nil, fr)
			if err != nil {
				t.Fatalf("a decoded frame does not encode: %v", err)
			}
			if !bytes.Equal(b, in[off:off+len(b)]) {
				t.Fatalf("frame at %d encodes as %x, read from %x", off, b, in[off:off+len(b)])
			}
			off += len(b)
		}
	})
}
