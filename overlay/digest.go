package overlay

import (
	"sync"

	"github.com/opencontainers/go-digest"
)

// asyncDigester computes a digest of what is written to it on a goroutine
// of its own, so that hashing a stream runs beside compressing and storing
// it instead of after it. Write copies its input and returns at once; the
// number of copies in flight is bounded.
type asyncDigester struct {
	d    digest.Digester
	work chan []byte
	free chan []byte
	wg   sync.WaitGroup
	done bool
	dgst digest.Digest
}

const asyncDigestBuffers = 8

func newAsyncDigester() *asyncDigester {
	a := &asyncDigester{
		d:    digest.Canonical.Digester(),
		work: make(chan []byte, asyncDigestBuffers),
		free: make(chan []byte, asyncDigestBuffers),
	}
	for range asyncDigestBuffers {
		a.free <- nil
	}
	a.wg.Add(1)
	go func() {
		defer a.wg.Done()
		h := a.d.Hash()
		for b := range a.work {
			h.Write(b)
			a.free <- b
		}
	}()
	return a
}

// Write never fails.
func (a *asyncDigester) Write(p []byte) (int, error) {
	if a.done {
		panic("asyncDigester: write after Digest")
	}
	b := <-a.free
	a.work <- append(b[:0], p...)
	return len(p), nil
}

// Digest waits for everything written so far to be hashed and returns the
// digest. No Write may follow.
func (a *asyncDigester) Digest() digest.Digest {
	if !a.done {
		a.done = true
		close(a.work)
		a.wg.Wait()
		a.dgst = a.d.Digest()
	}
	return a.dgst
}
