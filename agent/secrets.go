package agent

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"syscall"

	"hutch.dev/hutch/agent/wire"
)

var secretNameRE = regexp.MustCompile(`^[A-Z_][A-Z0-9_]*$`)

// writeSecrets is the write-secrets subcommand. It never prints a value.
func writeSecrets(stdin io.Reader) int {
	var secrets []wire.SecretFile
	if err := json.NewDecoder(stdin).Decode(&secrets); err != nil {
		fmt.Fprintln(os.Stderr, "hutch-init: write-secrets: bad input")
		return 2
	}
	for _, s := range secrets {
		if !secretNameRE.MatchString(s.Name) {
			fmt.Fprintf(os.Stderr, "hutch-init: write-secrets: bad name %q\n", s.Name)
			return 2
		}
		tmp := filepath.Join(wire.SecretsDir, "."+s.Name+".tmp")
		if err := os.WriteFile(tmp, s.Value, 0o400); err != nil {
			fmt.Fprintf(os.Stderr, "hutch-init: write-secrets: %s: %v\n", s.Name, errnoOf(err))
			return 1
		}
		if err := os.Rename(tmp, filepath.Join(wire.SecretsDir, s.Name)); err != nil {
			fmt.Fprintf(os.Stderr, "hutch-init: write-secrets: %s: %v\n", s.Name, errnoOf(err))
			return 1
		}
	}
	return 0
}

func errnoOf(err error) error {
	if pe, ok := err.(*os.PathError); ok {
		return pe.Err
	}
	return err
}

// SecretsEnv reads dir's secrets as KEY=VALUE entries, sorted by name.
func SecretsEnv(dir string) ([]string, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var env []string
	for _, e := range ents {
		if !e.Type().IsRegular() || !secretNameRE.MatchString(e.Name()) {
			continue
		}
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			return nil, err
		}
		env = append(env, e.Name()+"="+string(b))
	}
	sort.Strings(env)
	return env, nil
}

// withSecrets is the with-secrets subcommand: it adds the secrets to its
// environment, drops to --user if given (it starts as root so that it can
// read the 0400 files), and execs the command in place, so the command
// keeps its PID, stdio and signals. It fails as a shell would: 127 not
// found, 126 not executable.
func withSecrets(args []string) int {
	var uid, gid = -1, -1
	if len(args) >= 2 && args[0] == "--user" {
		u, g, ok := strings.Cut(args[1], ":")
		var err1, err2 error
		uid, err1 = strconv.Atoi(u)
		gid, err2 = strconv.Atoi(g)
		if !ok || err1 != nil || err2 != nil {
			fmt.Fprintln(os.Stderr, "hutch-init: with-secrets: --user UID:GID")
			return 2
		}
		args = args[2:]
	}
	if len(args) < 2 || args[0] != "--" {
		fmt.Fprintln(os.Stderr, "usage: hutch-init with-secrets [--user UID:GID] -- CMD [ARG...]")
		return 2
	}
	args = args[1:]
	secrets, err := SecretsEnv(wire.SecretsDir)
	if err != nil {
		fmt.Fprintf(os.Stderr, "hutch-init: reading %s: %v\n", wire.SecretsDir, errnoOf(err))
		return 126
	}
	env := append(os.Environ(), secrets...)
	if uid >= 0 {
		if st := becomeUser(uid, gid); st != 0 {
			return st
		}
	}
	if st := LookPath(args[0]); st != wire.StatusFound {
		return st
	}
	path := args[0]
	if !strings.Contains(path, "/") {
		if path, err = exec.LookPath(args[0]); err != nil {
			return wire.StatusNotFound
		}
	}
	err = syscall.Exec(path, args, env)
	fmt.Fprintf(os.Stderr, "hutch-init: exec %s: %v\n", args[0], err)
	return wire.StatusNotExecutable
}

// becomeUser drops this process to uid:gid with no supplementary groups;
// it returns 0, or 126 (the shell's "cannot run") having said why.
func becomeUser(uid, gid int) int {
	if err := syscall.Setgroups(nil); err != nil {
		fmt.Fprintf(os.Stderr, "hutch-init: setgroups: %v\n", err)
		return 126
	}
	if err := syscall.Setresgid(gid, gid, gid); err != nil {
		fmt.Fprintf(os.Stderr, "hutch-init: setgid %d: %v\n", gid, err)
		return 126
	}
	if err := syscall.Setresuid(uid, uid, uid); err != nil {
		fmt.Fprintf(os.Stderr, "hutch-init: setuid %d: %v\n", uid, err)
		return 126
	}
	return 0
}
