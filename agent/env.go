package agent

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"hutch.dev/hutch/agent/wire"
)

func init() {
	subcommands[wire.CmdWriteEnv] = func(args []string) int {
		if len(args) != 0 {
			fmt.Fprintln(os.Stderr, "usage: hutch-init write-env < ENV.json")
			return 2
		}
		return writeEnv(os.Stdin, wire.EnvFile)
	}
}

// writeEnv writes the JSON object of strings on stdin to path (see
// wire.EnvFile), replacing what was there in one rename.
func writeEnv(stdin io.Reader, path string) int {
	var env map[string]string
	if err := json.NewDecoder(stdin).Decode(&env); err != nil {
		fmt.Fprintln(os.Stderr, "hutch-init: write-env: want a JSON object of strings:", err)
		return 2
	}
	b, err := json.Marshal(env)
	if err != nil {
		fmt.Fprintln(os.Stderr, "hutch-init: write-env:", err)
		return 1
	}
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		fmt.Fprintf(os.Stderr, "hutch-init: write-env: %s: %v\n", dir, errnoOf(err))
		return 1
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, append(b, '\n'), 0o644); err != nil {
		fmt.Fprintf(os.Stderr, "hutch-init: write-env: %v\n", errnoOf(err))
		return 1
	}
	// WriteFile's mode is cut by the umask.
	if err := os.Chmod(tmp, 0o644); err != nil {
		fmt.Fprintf(os.Stderr, "hutch-init: write-env: %v\n", errnoOf(err))
		return 1
	}
	if err := os.Rename(tmp, path); err != nil {
		fmt.Fprintf(os.Stderr, "hutch-init: write-env: %v\n", errnoOf(err))
		return 1
	}
	return 0
}
