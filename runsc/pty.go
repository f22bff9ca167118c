package runsc

// WinSize is a terminal's size in character cells.
type WinSize struct {
	Rows, Cols uint16
}
