// Package wire is the protocol between the host and the agent inside a
// sandbox (hutch-init): the framing of the sessions the host holds with
// the agent (supervise, portmux, sshd) and what the agent's large-files
// mode reports. The host knows the agent through it alone; it runs on
// both sides and imports nothing of hutch.
package wire
