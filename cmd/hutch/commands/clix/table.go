package clix

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
)

// WriteTable writes items to w as a table: header, then the cells row
// gives each item. Every column but the last is as wide as its widest
// cell and pad spaces more.
func WriteTable[T any](w io.Writer, pad int, header []string, items []T, row func(T) []string) error {
	tw := tabwriter.NewWriter(w, 0, 8, pad, ' ', 0)
	fmt.Fprintln(tw, strings.Join(header, "\t"))
	for _, it := range items {
		fmt.Fprintln(tw, strings.Join(row(it), "\t"))
	}
	return tw.Flush()
}
