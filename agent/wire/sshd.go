package wire

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
)

// SSHConfig is what the host sends the agent's SSH server before the
// connection's bytes.
type SSHConfig struct {
	// HostKey is the sandbox's private host key, PEM (OpenSSH format).
	HostKey []byte `json:"hostKey"`
	// AuthorizedKeys are the public keys allowed in, in authorized_keys
	// format.
	AuthorizedKeys []string `json:"authorizedKeys"`
}

// maxSSHConfig bounds the config frame.
const maxSSHConfig = 1 << 20

// WriteSSHConfig writes c as a frame: a 4-byte big-endian length, then
// JSON.
func WriteSSHConfig(w io.Writer, c SSHConfig) error {
	b, err := json.Marshal(c)
	if err != nil {
		return err
	}
	var hdr [4]byte
	binary.BigEndian.PutUint32(hdr[:], uint32(len(b)))
	_, err = w.Write(append(hdr[:], b...))
	return err
}

// ReadSSHConfig reads a frame that WriteSSHConfig wrote, of at most
// maxSSHConfig bytes.
func ReadSSHConfig(r io.Reader) (SSHConfig, error) {
	var c SSHConfig
	var hdr [4]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return c, fmt.Errorf("read ssh config: %w", err)
	}
	n := binary.BigEndian.Uint32(hdr[:])
	if n > maxSSHConfig {
		return c, fmt.Errorf("ssh config of %d bytes is too large", n)
	}
	b := make([]byte, n)
	if _, err := io.ReadFull(r, b); err != nil {
		return c, fmt.Errorf("read ssh config: %w", err)
	}
	return c, json.Unmarshal(b, &c)
}
