package serve

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"slices"
	"strings"
	"sync"

	"github.com/containerd/log"
	"github.com/urfave/cli/v2"

	"hutch.dev/hutch/serve"
	"hutch.dev/hutch/serve/tenant"
)

// liveConfig is what a SIGHUP changes in a running server: the settings
// in effect, and the parts of the server that take new ones.
type liveConfig struct {
	c       *cli.Context
	src     *configSource
	level   *slog.LevelVar
	tenants *tenant.Store
	srv     *serve.Server
	log     *slog.Logger

	// mu guards applied, each key's value in effect.
	mu      sync.Mutex
	applied map[string][]string
}

func newLiveConfig(c *cli.Context, src *configSource, level *slog.LevelVar, tenants *tenant.Store, srv *serve.Server, log *slog.Logger) *liveConfig {
	l := &liveConfig{c: c, src: src, level: level, tenants: tenants, srv: srv, log: log, applied: map[string][]string{}}
	for _, s := range settings() {
		l.applied[s.name()] = current(c, s)
		if s.name() == "log-level" && !c.IsSet("log-level") {
			l.applied[s.name()] = keyDefault(s)
		}
	}
	return l
}

// reload reads the config file again, applies the live keys that changed
// and logs what it applied, what needs a restart, and what a flag or an
// environment variable holds instead. The tenants file is read again
// whatever the config says. A file that does not load changes nothing.
func (l *liveConfig) reload() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.tenants != nil {
		if err := l.tenants.Reload(); err != nil {
			l.log.Error("SIGHUP: the tenants file did not reload; the last good tenants stay", "path", l.tenants.Path(), "error", err)
		} else {
			l.log.Info("SIGHUP: read the tenants file again", "path", l.tenants.Path())
		}
	}
	if l.src.path == "" {
		l.log.Info("SIGHUP: no config file (--config \"\")")
		return
	}
	cf, err := readConfig(l.src.path)
	if errors.Is(err, fs.ErrNotExist) && !l.c.IsSet("config") {
		cf, err = &configFile{path: l.src.path, values: map[string][]string{}}, nil
	}
	if err != nil {
		l.log.Error("SIGHUP: the config file did not reload; the settings in effect stay", "error", err)
		return
	}
	applied, restart, overridden := []string{}, []string{}, []string{}
	for _, s := range settings() {
		name := s.name()
		want, inFile := cf.values[name]
		if fromOutside(l.c, l.src, name) {
			if inFile && !slices.Equal(want, l.applied[name]) {
				overridden = append(overridden, name)
			}
			continue
		}
		if !inFile {
			want = keyDefault(s)
		}
		if slices.Equal(want, l.applied[name]) {
			continue
		}
		if !liveKeys[name] {
			restart = append(restart, name)
			continue
		}
		if err := l.apply(name, want); err != nil {
			l.log.Error("SIGHUP: a key of the config file is not valid; its value in effect stays", "path", l.src.path, "key", name, "error", err)
			continue
		}
		l.applied[name] = want
		applied = append(applied, name+"="+strings.Join(want, ","))
	}
	l.log.Info("SIGHUP: reloaded the config file", "path", l.src.path, "applied", applied, "need_restart", restart, "set_by_flag_or_env", overridden)
}

// apply makes the live key name take vals.
func (l *liveConfig) apply(name string, vals []string) error {
	switch name {
	case "log-level":
		return setLogLevel(l.level, vals[0], true)
	case "default-network":
		return l.srv.SetDefaultNetwork(vals[0])
	}
	return fmt.Errorf("key %q does not change live", name)
}

// setLogLevel makes the server log at level: debug, info, warn or error;
// unset (hutch's own default, error) is info for a server. It sets the
// level of hutch's other logs too.
func setLogLevel(v *slog.LevelVar, level string, set bool) error {
	if !set {
		v.Set(slog.LevelInfo)
		return nil
	}
	var l slog.Level
	switch level {
	case "debug":
		l = slog.LevelDebug
	case "info":
		l = slog.LevelInfo
	case "warn":
		l = slog.LevelWarn
	case "error":
		l = slog.LevelError
	default:
		return fmt.Errorf("%q: want debug, info, warn or error", level)
	}
	if err := log.SetLevel(level); err != nil {
		return err
	}
	v.Set(l)
	return nil
}

// checkDefaultNetwork checks a default-network value.
func checkDefaultNetwork(mode string) error {
	switch mode {
	case "none", "open":
		return nil
	}
	return fmt.Errorf("%q: want none or open", mode)
}
