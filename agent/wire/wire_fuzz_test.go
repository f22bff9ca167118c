package wire

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"testing"
)

// The supervise wire comes from the other side of the sandbox boundary
// both ways: ReadFrame must never allocate past its bound nor accept a
// frame it did not read whole, and what it returns round-trips.
func FuzzReadFrame(f *testing.F) {
	var seed bytes.Buffer
	req, _ := json.Marshal(SuperviseRequest{Op: OpStart})
	WriteFrame(&seed, FrameRequest, req)
	f.Add(seed.Bytes())
	seed.Reset()
	x, _ := json.Marshal(ExitInfo{})
	WriteFrame(&seed, FrameExit, x)
	WriteFrame(&seed, FrameStdout, []byte("out"))
	f.Add(seed.Bytes())
	f.Add([]byte{FrameStdin, 0xff, 0xff, 0xff, 0xff})
	f.Add([]byte{FrameReply, 0, 0, 0, 3, '{', '}'})
	f.Fuzz(func(t *testing.T, b []byte) {
		r := bytes.NewReader(b)
		for {
			kind, payload, err := ReadFrame(r, MaxMeta)
			if err != nil {
				if !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) && !errors.Is(err, ErrFrameTooLarge) {
					t.Fatalf("unexpected error kind: %v", err)
				}
				return
			}
			if len(payload) > MaxMeta {
				t.Fatalf("payload of %d bytes past the bound %d", len(payload), MaxMeta)
			}
			var again bytes.Buffer
			WriteFrame(&again, kind, payload)
			k2, p2, err := ReadFrame(&again, MaxMeta)
			if err != nil || k2 != kind || !bytes.Equal(p2, payload) {
				t.Fatalf("frame does not round-trip: %v", err)
			}
			// What each side decodes from a payload.
			var q SuperviseRequest
			var rep SuperviseReply
			var ex ExitInfo
			_ = json.Unmarshal(payload, &q)
			_ = json.Unmarshal(payload, &rep)
			if json.Unmarshal(payload, &ex) == nil {
				_ = ex.Status()
			}
		}
	})
}

// The large-files report comes from inside a sandbox: whatever it says,
// the host accepts at most MaxLargeFiles absolute paths with sizes.
func FuzzParseLargeFiles(f *testing.F) {
	var seed bytes.Buffer
	WriteLargeFiles(&seed, []LargeFile{{Path: "/root/big", Size: 1 << 40}, {Path: "/a b\nc", Size: 5}})
	f.Add(seed.Bytes())
	f.Add([]byte("12 \x00"))
	f.Add([]byte("-1 /x\x00"))
	f.Fuzz(func(t *testing.T, b []byte) {
		files, err := ParseLargeFiles(b)
		if err != nil {
			return
		}
		if len(files) > MaxLargeFiles {
			t.Fatalf("%d records accepted", len(files))
		}
		for _, lf := range files {
			if lf.Size < 0 || len(lf.Path) == 0 || lf.Path[0] != '/' {
				t.Fatalf("bad record accepted: %+v", lf)
			}
		}
	})
}
