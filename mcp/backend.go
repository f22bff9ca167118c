package mcp

import (
	"context"
	"io"
	"io/fs"
	"os"
	"time"

	"hutch.dev/hutch/client"
)

// backend is what the tools act on: hutch's engine on this host
// (engineBackend), or a remote `hutch serve` through its Go client
// (remoteBackend). Every method that takes a sandbox_id refuses a sandbox
// the server does not manage as if it did not exist. The tools check
// their arguments before they call a backend.
type backend interface {
	create(ctx context.Context, a createArgs) (sandboxInfo, error)
	list(ctx context.Context) ([]sandboxInfo, error)
	remove(ctx context.Context, ref string) error
	pause(ctx context.Context, ref string) (sandboxInfo, error)
	resume(ctx context.Context, ref string) (sandboxInfo, error)
	snapshot(ctx context.Context, ref, name string) (snapshotResult, error)
	// checkpoint, checkpoints, restore and diffCheckpoints are the
	// sandbox's checkpoint tree; to "" in diffCheckpoints is the sandbox
	// now.
	checkpoint(ctx context.Context, ref, message string, keep int) (checkpointInfo, error)
	checkpoints(ctx context.Context, ref string) ([]checkpointInfo, error)
	restore(ctx context.Context, ref, ck string) (sandboxInfo, error)
	diffCheckpoints(ctx context.Context, ref, from, to string) ([]changeInfo, error)

	// exec runs a program and waits for it; a program that ran, even
	// one that failed or timed out, is a result.
	exec(ctx context.Context, ref string, x execSpec) (execOutcome, error)
	// start starts a shell command in the background and returns its
	// PID; its output goes to what logs reads.
	start(ctx context.Context, ref string, x execSpec) (int, error)
	// logs is the sandbox's log: lines "TIMESTAMP SOURCE TEXT".
	logs(ctx context.Context, ref string) (string, error)

	// readFile writes the file at path to w; a directory is an error.
	readFile(ctx context.Context, ref, path string, w io.Writer) error
	// writeFile creates or replaces a file, with its parents, owned by
	// the user the sandbox's commands run as.
	writeFile(ctx context.Context, ref, path string, data []byte, mode fs.FileMode) error
	listDir(ctx context.Context, ref, path string) ([]fileEntry, error)
	removeFile(ctx context.Context, ref, path string, recursive bool) error
	// upload copies src, a host file or directory of the allowed
	// directory open for reading, into the sandbox at path, named name
	// at the top; download copies path into the host target. Neither
	// resolves a host path: they act through the descriptors.
	upload(ctx context.Context, ref string, src *os.File, name, path string) error
	download(ctx context.Context, ref, path string, dst hostTarget) error

	expose(ctx context.Context, ref string, port, hostPort int) (exposeResult, error)

	// code is the code interpreter of a running sandbox (whether one
	// answers is known at the first call); done ends its connections.
	code(ctx context.Context, ref string) (cl *client.Code, done func(), err error)

	// close ends what the backend runs for the server (port forwards,
	// output streams); sandboxes go on.
	close()
}

// execSpec is a program to run in a sandbox.
type execSpec struct {
	Args    []string
	Env     map[string]string
	Workdir string
	// Stdin is fed to the program; empty gives it no input.
	Stdin   string
	Timeout time.Duration
}

// execOutcome is a finished program.
type execOutcome struct {
	runResult
	// missing: the program was not found and wrote nothing.
	missing bool
	// where names the sandbox and its image for a message.
	where string
}
