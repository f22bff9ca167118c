package engine

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/containerd/errdefs"
	"golang.org/x/crypto/ssh"

	"hutch.dev/hutch/agent/wire"
)

// SSH into a sandbox: the SSH server is the sandbox's agent ("sshd"),
// one `runsc exec` per connection with the connection on its stdin and
// stdout, so it needs no network and no sshd in the image. The host key
// is the sandbox's own, made at first use and kept in its state directory
// (it survives pause and resume; a fork gets a new one); it reaches the
// agent on its stdin, never through the sandbox's filesystem.

// sshHostKeyFile is the sandbox's SSH host key in its state directory.
const sshHostKeyFile = "ssh_host_ed25519_key"

// SSHHostKey returns sandbox ref's SSH host public key, making the key
// pair if it has none.
func (e *Engine) SSHHostKey(ctx context.Context, ref string) (ssh.PublicKey, error) {
	sb, err := e.get(ctx, ref)
	if err != nil {
		return nil, err
	}
	s, _, err := e.sshHostKey(sb)
	if err != nil {
		return nil, err
	}
	return s.PublicKey(), nil
}

// sshHostKey loads sb's host key, or makes and stores it. Concurrent
// first uses agree on one key: it is written aside and linked in place.
func (e *Engine) sshHostKey(sb *record) (ssh.Signer, []byte, error) {
	path := filepath.Join(e.sandboxDir(sb.ID), sshHostKeyFile)
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		if err := makeKeyFile(path); err != nil {
			return nil, nil, err
		}
		b, err = os.ReadFile(path)
	}
	if err != nil {
		return nil, nil, fmt.Errorf("ssh host key of sandbox %s: %w", sb.ShortID(), err)
	}
	s, err := ssh.ParsePrivateKey(b)
	if err != nil {
		return nil, nil, fmt.Errorf("ssh host key %s: %w", path, err)
	}
	return s, b, nil
}

// makeKeyFile writes a new ed25519 private key, 0600, at path unless
// there is one.
func makeKeyFile(path string) error {
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return err
	}
	blk, err := ssh.MarshalPrivateKey(priv, "")
	if err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), ".ssh-host-key-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(pem.EncodeToMemory(blk)); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	// CreateTemp made it 0600. Another first use may have won.
	if err := os.Link(tmp.Name(), path); err != nil && !errors.Is(err, fs.ErrExist) {
		return err
	}
	return nil
}

// SSHProxyOptions is one SSH connection into a sandbox.
type SSHProxyOptions struct {
	// AuthorizedKeys are the public keys allowed in (authorized_keys
	// lines); at least one.
	AuthorizedKeys []string
	// Conn carries the connection: the SSH client's bytes are read from
	// Stdin, the server's written to Stdout.
	Stdin  io.Reader
	Stdout io.Writer
}

// SSHProxy serves one SSH connection into running sandbox ref with the
// sandbox's agent, until either side closes it.
func (e *Engine) SSHProxy(ctx context.Context, ref string, o SSHProxyOptions) error {
	if len(o.AuthorizedKeys) == 0 {
		return fmt.Errorf("ssh: no authorized public key: %w", errdefs.ErrInvalidArgument)
	}
	for _, k := range o.AuthorizedKeys {
		if _, _, _, _, err := ssh.ParseAuthorizedKey([]byte(k)); err != nil {
			return fmt.Errorf("ssh: authorized key %q: %w: %w", strings.TrimSpace(k), err, errdefs.ErrInvalidArgument)
		}
	}
	sb, err := e.running(ctx, ref)
	if err != nil {
		return err
	}
	_, key, err := e.sshHostKey(sb)
	if err != nil {
		return err
	}
	pr, pw := io.Pipe()
	go func() {
		err := wire.WriteSSHConfig(pw, wire.SSHConfig{HostKey: key, AuthorizedKeys: o.AuthorizedKeys})
		if err == nil {
			_, err = io.Copy(pw, o.Stdin)
		}
		pw.CloseWithError(err)
	}()
	var errBuf capBuffer
	// As root: the agent changes to the SSH user per session.
	p, err := e.agentProcess(ctx, sb, []string{wire.ModeSSHD}, pr, writerOnly{o.Stdout}, &errBuf)
	if err != nil {
		pr.Close()
		return err
	}
	return agentWait(ctx, sb, p, &errBuf)
}

// writerOnly hides any other method of a writer (a caller's *os.File
// must not reach runsc).
type writerOnly struct{ io.Writer }

// SSHKnownHosts writes a known_hosts file that pins sandbox ref's host
// key under the names hosts, in the sandbox's state directory, and
// returns its path.
func (e *Engine) SSHKnownHosts(ctx context.Context, ref string, hosts []string) (string, error) {
	sb, err := e.get(ctx, ref)
	if err != nil {
		return "", err
	}
	s, _, err := e.sshHostKey(sb)
	if err != nil {
		return "", err
	}
	line := strings.Join(hosts, ",") + " " + string(ssh.MarshalAuthorizedKey(s.PublicKey()))
	path := filepath.Join(e.sandboxDir(sb.ID), "ssh_known_hosts")
	if err := writeFileAtomic(path, []byte(line), 0o600); err != nil {
		return "", err
	}
	return path, nil
}

// SSHUserKey is the key pair hutch makes for SSH into this root's
// sandboxes when the user has none: the private key's path and the
// public key, made on first use.
func (e *Engine) SSHUserKey() (string, string, error) {
	dir := filepath.Join(e.opts.Root, "ssh")
	path := filepath.Join(dir, "id_ed25519")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", "", err
	}
	if _, err := os.Stat(path); errors.Is(err, fs.ErrNotExist) {
		if err := makeKeyFile(path); err != nil {
			return "", "", err
		}
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return "", "", err
	}
	s, err := ssh.ParsePrivateKey(b)
	if err != nil {
		return "", "", fmt.Errorf("ssh key %s: %w", path, err)
	}
	return path, strings.TrimSpace(string(ssh.MarshalAuthorizedKey(s.PublicKey()))), nil
}

func writeFileAtomic(path string, b []byte, mode os.FileMode) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+"-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(b); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Chmod(mode); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}
