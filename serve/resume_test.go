package serve

import (
	"sync"
	"sync/atomic"
	"testing"
)

// Resumes of one sandbox run one at a time, and the server keeps no
// entry for a sandbox once its resumes are done.
func TestLockResume(t *testing.T) {
	s := &Server{resuming: map[string]*resumeLock{}}
	var inside, most atomic.Int32
	var wg sync.WaitGroup
	for i := 0; i < 50; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			id := "a"
			if i%2 == 1 {
				id = "b"
			}
			unlock := s.lockResume(id)
			if id == "a" {
				n := inside.Add(1)
				for {
					m := most.Load()
					if n <= m || most.CompareAndSwap(m, n) {
						break
					}
				}
				inside.Add(-1)
			}
			unlock()
		}()
	}
	wg.Wait()
	if most.Load() != 1 {
		t.Fatalf("%d resumes of one sandbox ran at once", most.Load())
	}
	if len(s.resuming) != 0 {
		t.Fatalf("entries left after every resume ended: %v", s.resuming)
	}
}
