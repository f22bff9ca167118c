// Package ssh is `hutch ssh`, `hutch ssh-config` and `hutch ssh-proxy`: SSH
// into a sandbox with any OpenSSH client (and so VS Code Remote-SSH,
// JetBrains Gateway, scp, sftp, rsync), through hutch as the ProxyCommand.
// The server is the sandbox's agent; the network is not involved.
package ssh

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/urfave/cli/v2"

	"hutch.dev/hutch/cmd/hutch/commands/clix"
	"hutch.dev/hutch/engine"
)

// Commands are ssh, ssh-config and ssh-proxy.
var Commands = []*cli.Command{sshCommand, configCommand, proxyCommand}

var keyFlag = &cli.StringSliceFlag{
	Name:  "authorized-key",
	Usage: "public key file allowed in (default: ~/.ssh/*.pub, else a key pair hutch makes under its root); its private key beside it, without .pub, is the IdentityFile",
}

var userFlag = &cli.StringFlag{
	Name:  "user",
	Usage: "user to log in as (default: the image's user, else root)",
}

var sshCommand = &cli.Command{
	Name:      "ssh",
	Usage:     "open an SSH session to a sandbox (a shell, or CMD) with the system's ssh",
	ArgsUsage: "ID [-- CMD...]",
	Flags:     []cli.Flag{keyFlag, userFlag},
	Action: func(c *cli.Context) error {
		a := c.Args().Slice()
		if len(a) == 0 {
			return clix.UsageError(fmt.Errorf("usage: hutch ssh ID [-- CMD...]"))
		}
		ref, cmd := a[0], a[1:]
		if len(cmd) > 0 && cmd[0] == "--" {
			cmd = cmd[1:]
		}
		sshPath, err := exec.LookPath("ssh")
		if err != nil {
			return fmt.Errorf("ssh: the OpenSSH client is not installed (apt-get install openssh-client): %w", err)
		}
		e, err := clix.Engine(c)
		if err != nil {
			return err
		}
		host, conf, err := hostBlock(c, e, ref)
		if err != nil {
			return err
		}
		f, err := os.CreateTemp("", "hutch-ssh-config-*")
		if err != nil {
			return err
		}
		defer os.Remove(f.Name())
		if _, err := f.WriteString(conf); err != nil {
			f.Close()
			return err
		}
		if err := f.Close(); err != nil {
			return err
		}
		args := append([]string{"-F", f.Name(), "--", host}, cmd...)
		ssh := exec.Command(sshPath, args...)
		ssh.Stdin, ssh.Stdout, ssh.Stderr = os.Stdin, os.Stdout, os.Stderr
		// ssh handles the terminal's signals itself.
		signal.Ignore(syscall.SIGINT, syscall.SIGQUIT)
		err = ssh.Run()
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return clix.Exit(ee.ExitCode(), nil)
		}
		return err
	},
}

var configCommand = &cli.Command{
	Name:      "ssh-config",
	Usage:     "print an OpenSSH Host block for a sandbox (for ~/.ssh/config, VS Code Remote-SSH, ssh -F)",
	ArgsUsage: "ID",
	Flags:     []cli.Flag{keyFlag, userFlag},
	Action: func(c *cli.Context) error {
		a, err := clix.Args(c, 1, 1, "ID")
		if err != nil {
			return err
		}
		e, err := clix.Engine(c)
		if err != nil {
			return err
		}
		_, conf, err := hostBlock(c, e, a[0])
		if err != nil {
			return err
		}
		_, err = fmt.Fprint(c.App.Writer, conf)
		return err
	},
}

var proxyCommand = &cli.Command{
	Name:      "ssh-proxy",
	Usage:     "serve one SSH connection to a sandbox on stdin and stdout (an OpenSSH ProxyCommand)",
	ArgsUsage: "ID",
	Flags:     []cli.Flag{keyFlag},
	Action: func(c *cli.Context) error {
		a, err := clix.Args(c, 1, 1, "ID")
		if err != nil {
			return err
		}
		e, err := clix.Engine(c)
		if err != nil {
			return err
		}
		pubs, _, err := keys(c, e)
		if err != nil {
			return err
		}
		// ssh ends the proxy with SIGHUP when it is done.
		ctx, stop := signal.NotifyContext(c.Context, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
		defer stop()
		err = e.SSHProxy(ctx, a[0], engine.SSHProxyOptions{AuthorizedKeys: pubs, Stdin: os.Stdin, Stdout: os.Stdout})
		if ctx.Err() != nil {
			return nil // ssh closed the connection
		}
		return err
	},
}

// keys are the public keys allowed in and the private keys (IdentityFile)
// that go with them: --authorized-key's, else ~/.ssh/*.pub, else the
// root's own key pair.
func keys(c *cli.Context, e *engine.Engine) (pubs, identities []string, err error) {
	files := c.StringSlice("authorized-key")
	explicit := len(files) > 0
	if !explicit {
		if home, err := os.UserHomeDir(); err == nil {
			files, _ = filepath.Glob(filepath.Join(home, ".ssh", "*.pub"))
		}
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			if explicit {
				return nil, nil, clix.UsageError(fmt.Errorf("--authorized-key: %w", err))
			}
			continue
		}
		n := 0
		for _, l := range strings.Split(string(b), "\n") {
			if l = strings.TrimSpace(l); l != "" && !strings.HasPrefix(l, "#") {
				pubs = append(pubs, l)
				n++
			}
		}
		if n == 0 && explicit {
			return nil, nil, clix.UsageError(fmt.Errorf("--authorized-key %s: no public key in it", f))
		}
		priv := strings.TrimSuffix(f, ".pub")
		if priv != f {
			if _, err := os.Stat(priv); err == nil {
				abs, _ := filepath.Abs(priv)
				identities = append(identities, abs)
			}
		}
	}
	if len(pubs) == 0 {
		priv, pub, err := e.SSHUserKey()
		if err != nil {
			return nil, nil, err
		}
		pubs, identities = []string{pub}, []string{priv}
	}
	return pubs, identities, nil
}

// hostBlock is the Host block of sandbox ref and the host name to use.
func hostBlock(c *cli.Context, e *engine.Engine, ref string) (string, string, error) {
	sb, err := e.Get(c.Context, ref)
	if err != nil {
		return "", "", err
	}
	_, ids, err := keys(c, e)
	if err != nil {
		return "", "", err
	}
	hosts := []string{"hutch-" + ref}
	for _, h := range []string{"hutch-" + sb.ShortID(), "hutch-" + sb.Name} {
		if h != "hutch-" && h != hosts[0] {
			hosts = append(hosts, h)
		}
	}
	known, err := e.SSHKnownHosts(c.Context, sb.ID, []string{"hutch-" + sb.ID})
	if err != nil {
		return "", "", err
	}
	user := c.String("user")
	if user == "" {
		user = imageUser(sb.ImageUser)
	}
	proxy, err := proxyArgs(c, sb.ID)
	if err != nil {
		return "", "", err
	}
	var b strings.Builder
	fmt.Fprintf(&b, "Host %s\n", strings.Join(hosts, " "))
	fmt.Fprintf(&b, "  User %s\n", user)
	fmt.Fprintf(&b, "  ProxyCommand %s\n", proxy)
	fmt.Fprintf(&b, "  HostKeyAlias hutch-%s\n", sb.ID)
	fmt.Fprintf(&b, "  UserKnownHostsFile %s\n", quote(known))
	fmt.Fprintf(&b, "  StrictHostKeyChecking yes\n")
	for _, id := range ids {
		fmt.Fprintf(&b, "  IdentityFile %s\n", quote(id))
	}
	if len(ids) > 0 {
		fmt.Fprintf(&b, "  IdentitiesOnly yes\n")
	}
	fmt.Fprintf(&b, "  ForwardAgent no\n")
	fmt.Fprintf(&b, "  ServerAliveInterval 30\n")
	return hosts[0], b.String(), nil
}

// imageUser is the login name for the image's USER: a name, else root.
func imageUser(u string) string {
	name, _, _ := strings.Cut(u, ":")
	if name == "" || strings.Trim(name, "0123456789") == "" {
		return "root"
	}
	return name
}

// proxyArgs is the ProxyCommand: this hutch, with the same root and runsc.
func proxyArgs(c *cli.Context, id string) (string, error) {
	exe, err := os.Executable()
	if err != nil {
		return "", err
	}
	root := c.String("root")
	if root == "" {
		root = engine.DefaultRoot()
	}
	if abs, err := filepath.Abs(root); err == nil {
		root = abs
	}
	args := []string{exe, "--root", root}
	if r := c.String("runsc"); r != "" {
		if abs, err := filepath.Abs(r); err == nil {
			r = abs
		}
		args = append(args, "--runsc", r)
	}
	args = append(args, "ssh-proxy")
	for _, k := range c.StringSlice("authorized-key") {
		if abs, err := filepath.Abs(k); err == nil {
			k = abs
		}
		args = append(args, "--authorized-key", k)
	}
	args = append(args, id)
	for i, a := range args {
		args[i] = quote(a)
	}
	return strings.Join(args, " "), nil
}

// quote quotes s for ssh_config and the shell that runs ProxyCommand.
func quote(s string) string {
	if s != "" && strings.Trim(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789/._-+=:,@") == "" {
		return s
	}
	return `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`, `$`, `\$`, "`", "\\`").Replace(s) + `"`
}
