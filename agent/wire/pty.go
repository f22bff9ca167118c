package wire

import "fmt"

// CmdPty is the name of the agent's pty mode.
const CmdPty = "pty"

// PtyArgs are the agent's arguments that run argv on a terminal of
// rows x cols (zero: the pty's default size).
func PtyArgs(rows, cols uint16, argv []string) []string {
	args := []string{MountPath, CmdPty}
	if rows > 0 && cols > 0 {
		args = append(args, "--size", fmt.Sprintf("%dx%d", rows, cols))
	}
	return append(append(args, "--"), argv...)
}
