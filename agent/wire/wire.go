// Package wire is the protocol between the host and the agent inside a
// sandbox (hutch-init): where the agent and what the host hands it are
// mounted, the names, arguments and exit statuses of the agent's modes
// and what they print, the framing of the sessions the host holds with
// the agent (supervise, portmux, sshd), and the rules both sides apply
// alike (MergeEnv, Started). The host knows the agent through it alone;
// it runs on both sides and imports nothing of hutch.
package wire

// MountPath is where the agent binary appears inside a sandbox.
const MountPath = "/.hutch/hutch-init"

// Exit statuses of lookpath, the shell's conventions.
const (
	StatusFound         = 0
	StatusNotExecutable = 126
	StatusNotFound      = 127
)
