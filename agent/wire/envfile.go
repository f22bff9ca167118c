package wire

// A sandbox restored from a template's checkpoint carries on the
// processes of the template's build, with the environment they started
// with. The environment the create gave is written to EnvFile, so that
// such a process (the code interpreter's server, for its kernels) can
// take it up; every command run in the sandbox gets it as its
// environment as well.
const (
	// EnvFile holds the create's environment as a JSON object of
	// strings, mode 0644, on the sandbox's /run (a tmpfs in gVisor's
	// memory). It is written before the create returns, and replaced
	// whole (a rename) on a later write.
	EnvFile = "/run/hutch/env"
	// CmdWriteEnv reads that JSON object on stdin and writes EnvFile.
	CmdWriteEnv = "write-env"
)
