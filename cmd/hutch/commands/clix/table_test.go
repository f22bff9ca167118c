package clix

import (
	"strings"
	"testing"
)

func TestWriteTable(t *testing.T) {
	rows := [][]string{{"a", "long value", "x"}, {"bbbb", "", "last column is not padded"}}
	for _, tc := range []struct {
		pad  int
		want string
	}{
		{2, "NAME  VALUE       NOTE\na     long value  x\nbbbb              last column is not padded\n"},
		{3, "NAME   VALUE        NOTE\na      long value   x\nbbbb                last column is not padded\n"},
	} {
		var b strings.Builder
		if err := WriteTable(&b, tc.pad, []string{"NAME", "VALUE", "NOTE"}, rows, func(r []string) []string { return r }); err != nil {
			t.Fatal(err)
		}
		if b.String() != tc.want {
			t.Errorf("pad %d:\n%q\nwant\n%q", tc.pad, b.String(), tc.want)
		}
	}
}
