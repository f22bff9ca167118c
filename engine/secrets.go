package engine

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/containerd/errdefs"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"hutch.dev/hutch/agent/wire"
	"hutch.dev/hutch/policy"
	"hutch.dev/hutch/runsc"
)

// Secrets reach a sandbox without touching the host's disk: hutch reads them
// (from a file or its environment) at create, pipes them to the agent
// inside the sandbox, which writes them to a tmpfs in gVisor's memory
// (wire.SecretsDir), and every later exec reads them from there into the
// command's environment (agent with-secrets). hutch keeps only their names.

// Secret is a secret given by value (CreateRequest.SecretValues): the form
// for a program that embeds the engine and takes secrets from others, for
// which Create reads no file and no variable of its own host.
type Secret struct {
	Name  string
	Value []byte
}

// String shows the name, never the value.
func (s Secret) String() string { return s.Name + "=(value)" }

// ResolveSecretRefs reads "NAME=@FILE" and "NAME=env:VAR" references from
// this process's files and environment, as hutch's --secret does. Files are
// read only if regular and at most policy.MaxSecretSize, checked before
// reading. Its errors never hold a value.
func ResolveSecretRefs(refs []string) ([]Secret, error) {
	loaded, err := policy.LoadSecrets(refs, policy.ReadSecretFile, os.LookupEnv)
	if err != nil {
		return nil, err
	}
	out := make([]Secret, 0, len(loaded))
	for _, s := range loaded {
		if s.Err != nil {
			return nil, fmt.Errorf("%w: --secret %s: %w", errdefs.ErrInvalidArgument, s.Name, s.Err)
		}
		out = append(out, Secret{Name: s.Name, Value: s.Value})
	}
	return out, nil
}

// loadSecrets is the policy's view of a create's secrets: the references
// (read as ResolveSecretRefs does) and the values.
func loadSecrets(refs []string, values []Secret) ([]policy.Secret, error) {
	out, err := policy.LoadSecrets(refs, policy.ReadSecretFile, os.LookupEnv)
	if err != nil {
		return nil, err
	}
	for _, v := range values {
		out = append(out, policy.Secret{Name: v.Name, Value: v.Value})
	}
	return out, nil
}

// secretsMount is the tmpfs that holds a sandbox's secrets.
func secretsMount() specs.Mount {
	return specs.Mount{
		Destination: wire.SecretsDir, Type: "tmpfs", Source: "tmpfs",
		Options: []string{"nosuid", "nodev", "noexec", "mode=0755", "size=8m"},
	}
}

// secretNames lists the names of secrets.
func secretNames(secrets []policy.Secret) []string {
	var n []string
	for _, s := range secrets {
		n = append(n, s.Name)
	}
	return n
}

// writeSecrets hands the secrets to the sandbox's agent through a pipe.
// Its error never holds a value: the agent prints none.
func (e *Engine) writeSecrets(ctx context.Context, sb *record, secrets []policy.Secret) error {
	files := make([]wire.SecretFile, 0, len(secrets))
	for _, s := range secrets {
		files = append(files, wire.SecretFile{Name: s.Name, Value: s.Value})
	}
	payload, err := json.Marshal(files)
	if err != nil {
		return err
	}
	return e.agentAsRoot(ctx, sb, wire.CmdWriteSecrets, bytes.NewReader(payload), "writing secrets into the sandbox")
}

// writeEnv writes the create's environment to the sandbox's
// wire.EnvFile, for the processes a template's checkpoint restored: they
// started before the create and have the build's environment (the code
// interpreter's server reads the file into its kernels).
func (e *Engine) writeEnv(ctx context.Context, sb *record, env []string) error {
	m := make(map[string]string, len(env))
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		m[k] = v
	}
	payload, err := json.Marshal(m)
	if err != nil {
		return err
	}
	return e.agentAsRoot(ctx, sb, wire.CmdWriteEnv, bytes.NewReader(payload), "writing the environment into the sandbox")
}

// agentAsRoot runs the agent's cmd in sb as root with all of runsc's
// default capabilities, whatever the sandbox's user, stdin its input,
// and turns a failure into an error saying what (its stderr, which the
// agent keeps free of values).
func (e *Engine) agentAsRoot(ctx context.Context, sb *record, cmd string, stdin io.Reader, what string) error {
	var stderr bytes.Buffer
	caps := append([]string(nil), runsc.DefaultCapabilities...)
	p, err := e.runscFor(sb).Exec(ctx, sb.ID, specs.Process{
		Args: []string{wire.MountPath, cmd}, Cwd: "/",
		Env:          []string{"PATH=/usr/bin:/bin"},
		Capabilities: &specs.LinuxCapabilities{Bounding: caps, Effective: caps, Permitted: caps},
	}, runsc.ExecOpts{Stdin: stdin, Stderr: &stderr})
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	if code, err := p.Wait(); err != nil || code != 0 {
		return fmt.Errorf("%s failed (status %d): %s", what, code, strings.TrimSpace(stderr.String()))
	}
	return nil
}

// withSecrets wraps proc so that the agent adds the sandbox's secrets to
// its environment. The agent starts as root to read them and drops to
// proc's user itself.
func withSecrets(proc specs.Process) specs.Process {
	return agentFirst(proc, wire.CmdWithSecrets)
}

// agentFirst wraps proc so that the agent's cmd runs first, as root with
// root's capabilities, and then becomes proc as proc's user.
func agentFirst(proc specs.Process, cmd string) specs.Process {
	args := []string{wire.MountPath, cmd}
	if proc.User.UID != 0 || proc.User.GID != 0 {
		args = append(args, "--user", fmt.Sprintf("%d:%d", proc.User.UID, proc.User.GID))
	}
	proc.Args = append(append(args, "--"), proc.Args...)
	proc.User = specs.User{}
	caps := append([]string(nil), runsc.DefaultCapabilities...)
	if proc.Capabilities != nil && len(proc.Capabilities.Effective) == 0 {
		// A non-root user: the agent needs root's capabilities for its
		// work and to change user; setuid to non-root clears them again.
		proc.Capabilities = &specs.LinuxCapabilities{Bounding: caps, Effective: caps, Permitted: caps}
	}
	return proc
}
