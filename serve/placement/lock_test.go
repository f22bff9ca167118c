package placement

import (
	"sync"
	"sync/atomic"
	"testing"
)

// What locks one sandbox runs one at a time, and no entry is kept for a
// sandbox once its locks are released.
func TestLocks(t *testing.T) {
	var l Locks
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
			unlock := l.Lock(id)
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
		t.Fatalf("%d holders of one sandbox's lock at once", most.Load())
	}
	if n := l.count(); n != 0 {
		t.Fatalf("%d entries left after every lock was released", n)
	}
}
