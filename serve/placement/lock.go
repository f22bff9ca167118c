package placement

import "sync"

// Locks serializes what must not run at the same time on one sandbox:
// its resumes, and on some backends its pauses, forks and snapshots. The
// zero value is ready to use.
type Locks struct {
	// mu guards held: an entry only while its lock is held or waited
	// for.
	mu   sync.Mutex
	held map[string]*sandboxLock
}

// sandboxLock is one sandbox's lock; n counts its holders and waiters,
// so that the entry goes once nobody needs it.
type sandboxLock struct {
	mu sync.Mutex
	n  int
}

// Lock takes sandbox id's lock; the function returned releases it.
func (l *Locks) Lock(id string) (unlock func()) {
	l.mu.Lock()
	if l.held == nil {
		l.held = map[string]*sandboxLock{}
	}
	sl, ok := l.held[id]
	if !ok {
		sl = &sandboxLock{}
		l.held[id] = sl
	}
	sl.n++
	l.mu.Unlock()
	sl.mu.Lock()
	return func() {
		sl.mu.Unlock()
		l.mu.Lock()
		if sl.n--; sl.n == 0 {
			delete(l.held, id)
		}
		l.mu.Unlock()
	}
}

// count counts the sandboxes whose lock is held or waited for.
func (l *Locks) count() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.held)
}
