package engine

import "testing"

// A listing past its bound ends the agent once and keeps nothing.
func TestListingBufferBound(t *testing.T) {
	ended := 0
	l := &listingBuffer{max: 10, over: func() { ended++ }}
	if n, err := l.Write([]byte("0123456789")); n != 10 || err != nil {
		t.Fatalf("a write within the bound: %d, %v", n, err)
	}
	for range 2 {
		if _, err := l.Write([]byte("x")); err == nil {
			t.Fatal("a write past the bound succeeded")
		}
	}
	if !l.full || ended != 1 || l.buf.Len() != 0 {
		t.Errorf("past the bound: full %v, ended %d times, %d bytes kept; want full, once, none", l.full, ended, l.buf.Len())
	}
}
