// Package clix holds what every hutch command shares: global flags, the
// engine constructor, exit statuses and output formats.
package clix

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/containerd/log"
	"github.com/urfave/cli/v2"

	"hutch.dev/hutch/engine"
)

// ExitRuntime is hutch's own failure status, as docker's.
const ExitRuntime = 125

// Status is an exit status with an optional message (nil: print nothing).
type Status struct {
	Code int
	Err  error
}

func (s *Status) Error() string {
	if s.Err == nil {
		return fmt.Sprintf("exit status %d", s.Code)
	}
	return s.Err.Error()
}

func (s *Status) Unwrap() error { return s.Err }

// Exit makes a command end with code, printing err if non-nil.
func Exit(code int, err error) error {
	if code == 0 && err == nil {
		return nil
	}
	return &Status{Code: code, Err: err}
}

// UsageError is a bad flag or argument: exit 125 with the message.
func UsageError(err error) error {
	return &Status{Code: ExitRuntime, Err: err}
}

// GlobalFlags are hutch's flags before the command.
var GlobalFlags = []cli.Flag{
	&cli.StringFlag{Name: "root", Usage: "state directory (default /var/lib/hutch for root, $XDG_DATA_HOME/hutch otherwise)", EnvVars: []string{"HUTCH_ROOT"}},
	&cli.StringFlag{Name: "runsc", Usage: "runsc binary (default: beside hutch, then $PATH)", EnvVars: []string{"HUTCH_RUNSC"}},
	&cli.StringFlag{Name: "log-level", Value: "error", Usage: "log level: debug, info, warn, error", EnvVars: []string{"HUTCH_LOG_LEVEL"}},
	&cli.StringFlag{Name: "runsc-debug-log", Usage: "directory for runsc debug logs", Hidden: true},
	&cli.StringFlag{Name: "buildkit-addr", Usage: "build with this buildkitd (default: hutch runs its own, on demand)", EnvVars: []string{"HUTCH_BUILDKIT_ADDR"}},
	&cli.DurationFlag{Name: "buildkit-idle", Usage: "how long hutch's own buildkitd stays up after a build", EnvVars: []string{"HUTCH_BUILDKIT_IDLE"}, Hidden: true},
}

// Before applies the global flags.
func Before(c *cli.Context) error {
	if err := log.SetLevel(c.String("log-level")); err != nil {
		return UsageError(fmt.Errorf("--log-level %q: %w", c.String("log-level"), err))
	}
	return nil
}

// Engine opens the engine the global flags describe.
func Engine(c *cli.Context) (*engine.Engine, error) {
	return EngineWith(c, engine.Options{})
}

// EngineWith is Engine with the further options of opts (those the global
// flags do not set).
func EngineWith(c *cli.Context, opts engine.Options) (*engine.Engine, error) {
	return engine.Open(engine.Options{
		NoDocker: opts.NoDocker,

		Root:            c.String("root"),
		RunscPath:       c.String("runsc"),
		DebugLog:        c.String("runsc-debug-log"),
		WatchdogCommand: watchdogCommand(c),

		BuildkitAddr: c.String("buildkit-addr"),
		BuildkitIdle: c.Duration("buildkit-idle"),
	})
}

// WatchdogCommandName is the hidden command that enforces a sandbox's
// lifetime (engine.Engine.RunWatchdog).
const WatchdogCommandName = "lifetime-watchdog"

// watchdogCommand is this hutch, with the same root and runsc, running the
// lifetime watchdog.
func watchdogCommand(c *cli.Context) []string {
	exe, err := os.Executable()
	if err != nil {
		return nil
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
	return append(args, WatchdogCommandName)
}

// FormatFlag is --format for list and inspect commands.
var FormatFlag = &cli.StringFlag{Name: "format", Value: "table", Usage: "output format: table or json"}

// CheckFormat validates --format.
func CheckFormat(c *cli.Context) (json bool, err error) {
	switch f := c.String("format"); f {
	case "table", "":
		return false, nil
	case "json":
		return true, nil
	default:
		return false, UsageError(fmt.Errorf("--format %q: want table or json", f))
	}
}

// WriteJSON writes v as indented JSON.
func WriteJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// Args checks the command's positional arguments count.
func Args(c *cli.Context, min, max int, usage string) ([]string, error) {
	a := c.Args().Slice()
	if len(a) < min || (max >= 0 && len(a) > max) {
		return nil, UsageError(fmt.Errorf("usage: hutch %s %s", c.Command.FullName(), usage))
	}
	return a, nil
}

// CommandAfterID splits "ID [--] CMD..." into the ID and the command.
func CommandAfterID(c *cli.Context, usage string) (string, []string, error) {
	a := c.Args().Slice()
	if len(a) >= 2 && a[1] == "--" {
		a = append(a[:1:1], a[2:]...)
	}
	if len(a) < 2 {
		return "", nil, UsageError(fmt.Errorf("usage: hutch %s %s", c.Command.FullName(), usage))
	}
	return a[0], a[1:], nil
}

// KeyValues parses repeated K=V flags.
func KeyValues(flag string, vals []string) (map[string]string, error) {
	if len(vals) == 0 {
		return nil, nil
	}
	m := map[string]string{}
	for _, kv := range vals {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return nil, UsageError(fmt.Errorf("--%s %q: want KEY=VALUE", flag, kv))
		}
		m[k] = v
	}
	return m, nil
}
