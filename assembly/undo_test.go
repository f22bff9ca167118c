package assembly

import (
	"slices"
	"testing"
)

func TestUndo(t *testing.T) {
	var got []int
	var u Undo
	for i := range 3 {
		u.Add(func() { got = append(got, i) })
	}
	u.Run()
	u.Run() // once only
	if !slices.Equal(got, []int{2, 1, 0}) {
		t.Fatalf("ran %v, want 2 1 0", got)
	}
	got = nil
	u.Add(func() { got = append(got, 9) })
	u.Release()
	u.Run()
	if len(got) != 0 {
		t.Fatalf("a released stack ran %v", got)
	}
}
