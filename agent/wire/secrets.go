package wire

// SecretsDir is the tmpfs (in gVisor's memory) that holds a sandbox's
// secrets, one file per secret, mode 0400, owned by root.
const SecretsDir = "/run/secrets"

// Subcommands of the agent for secrets.
const (
	// CmdWriteSecrets reads SecretFiles as JSON on stdin and writes them
	// into SecretsDir.
	CmdWriteSecrets = "write-secrets"
	// CmdWithSecrets runs a command with the secrets in its environment:
	// hutch-init with-secrets [--user UID:GID] -- CMD [ARG...]
	CmdWithSecrets = "with-secrets"
)

// SecretFile is one secret as hutch hands it to write-secrets.
type SecretFile struct {
	Name  string `json:"name"`
	Value []byte `json:"value"`
}
