package engine

import (
	"os"

	"hutch.dev/hutch/runsc"
)

// LostOutput returns those of this process's stdout and stderr that lost
// some of a sandbox's output because their reader had gone: a command's
// output that had all been read when its reader went is not lost (`sh -c
// 'echo a; sleep 1' | head -1`). A pipeline's writer that loses output
// ends by SIGPIPE, one that does not exits as it would have.
func LostOutput() []*os.File { return runsc.LostOutput() }
