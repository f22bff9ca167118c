package wire

// The agent's modes: its first argument names one. The host runs the
// agent as MountPath with one of these, its arguments after.
const (
	// ModeLookPath tells why a command could not start (Status*).
	ModeLookPath = "lookpath"
	// ModeSpawn asks the running init to start a background process.
	ModeSpawn = "spawn"
	// ModeSupervise is a session of supervised processes.
	ModeSupervise = "supervise"
	// ModePortMux is the sandbox's end of port forwarding.
	ModePortMux = "portmux"
	// ModeListen and ModeListenServe serve the agent's API on a port.
	ModeListen      = "listen"
	ModeListenServe = "listen-serve"
	// ModePty runs a command on a terminal the agent makes.
	ModePty = "pty"
	// ModeShell starts the sandbox user's login shell.
	ModeShell = "shell"
	// ModeSSHD and ModeSFTPServer are the sandbox's end of hutch ssh.
	ModeSSHD       = "sshd"
	ModeSFTPServer = "sftp-server"
	// ModeTarOut and ModeTarIn copy files out of and into the sandbox.
	ModeTarOut = "tar-out"
	ModeTarIn  = "tar-in"
	// ModeLargeFiles lists regular files larger than a size.
	ModeLargeFiles = "large-files"
	// File operations.
	ModeStat  = "stat"
	ModeLs    = "ls"
	ModeCat   = "cat"
	ModeWrite = "write"
	ModeRm    = "rm"
	ModeMkdir = "mkdir"
	ModeMv    = "mv"
	ModeWatch = "watch"
)
