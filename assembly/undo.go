package assembly

// Undo is the undo stack of a start that may fail halfway (a sandbox's
// create, resume or fork; a pod's or container's creation): each step
// that made something adds what takes it back, and on failure Run takes
// everything back, last made first. On success Release drops the stack.
type Undo struct{ fns []func() }

// Add puts f on the stack.
func (u *Undo) Add(f func()) { u.fns = append(u.fns, f) }

// Release drops the stack: what was made stays.
func (u *Undo) Release() { u.fns = nil }

// Run takes back what was made, in reverse order, once.
func (u *Undo) Run() {
	for i := len(u.fns) - 1; i >= 0; i-- {
		u.fns[i]()
	}
	u.fns = nil
}
