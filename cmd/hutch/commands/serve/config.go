package serve

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/pelletier/go-toml/v2"
	"github.com/urfave/cli/v2"

	"hutch.dev/hutch/cmd/hutch/commands/clix"
)

// DefaultConfigPath is where serve reads its settings from when --config
// is not given; a missing file there is no error.
const DefaultConfigPath = "/etc/hutch/serve.toml"

// globalKeys are hutch's global flags that serve.toml also holds: the
// state root and runsc a system server uses, and its log level.
var globalKeys = []string{"root", "runsc", "log-level"}

// liveKeys are the keys a SIGHUP applies to the running server; a change
// to any other key is logged as needing a restart.
var liveKeys = map[string]bool{"log-level": true, "default-network": true}

// configFlag is --config, the one serve flag serve.toml does not hold.
var configFlag = &cli.StringFlag{
	Name: "config", Value: DefaultConfigPath, EnvVars: []string{"HUTCH_SERVE_CONFIG"},
	Usage: "FILE of serve's settings, one key per flag (a missing " + DefaultConfigPath + " is no error; \"\" for none); flags and environment variables win over it",
}

// setting is one key of serve.toml: a flag of serve or a global one.
type setting struct {
	flag   cli.Flag
	global bool
}

func (s setting) name() string { return s.flag.Names()[0] }

// settings are the keys of serve.toml, in the order of serve's flags
// after the global ones.
func settings() []setting {
	var out []setting
	for _, g := range globalKeys {
		for _, f := range clix.GlobalFlags {
			if f.Names()[0] == g {
				out = append(out, setting{flag: f, global: true})
			}
		}
	}
	for _, f := range serveFlags {
		if f == configFlag || isHidden(f) {
			continue
		}
		out = append(out, setting{flag: f})
	}
	return out
}

func isHidden(f cli.Flag) bool {
	h, ok := f.(interface{ IsVisible() bool })
	return ok && !h.IsVisible()
}

// EnvVar is the environment variable that sets the key name of
// serve.toml: HUTCH_SERVE_ and the name in capitals, dashes as
// underscores. A global flag keeps its own variable.
func EnvVar(name string) string {
	return "HUTCH_SERVE_" + strings.ToUpper(strings.ReplaceAll(name, "-", "_"))
}

// withServeEnv adds each serve flag's HUTCH_SERVE_* variable to its own.
func withServeEnv(flags []cli.Flag) []cli.Flag {
	for _, f := range flags {
		name := f.Names()[0]
		if name == "config" {
			continue
		}
		switch f := f.(type) {
		case *cli.StringFlag:
			f.EnvVars = append([]string{EnvVar(name)}, f.EnvVars...)
		case *cli.BoolFlag:
			f.EnvVars = append([]string{EnvVar(name)}, f.EnvVars...)
		case *cli.IntFlag:
			f.EnvVars = append([]string{EnvVar(name)}, f.EnvVars...)
		case *cli.Float64Flag:
			f.EnvVars = append([]string{EnvVar(name)}, f.EnvVars...)
		case *cli.DurationFlag:
			f.EnvVars = append([]string{EnvVar(name)}, f.EnvVars...)
		case *cli.StringSliceFlag:
			f.EnvVars = append([]string{EnvVar(name)}, f.EnvVars...)
		default:
			panic(fmt.Sprintf("serve flag --%s: type %T has no serve.toml form", name, f))
		}
	}
	return flags
}

// envVars are the variables of f.
func envVars(f cli.Flag) []string {
	if e, ok := f.(interface{ GetEnvVars() []string }); ok {
		return e.GetEnvVars()
	}
	return nil
}

// configFile is serve.toml as read: its path and the value of each key,
// rendered as a flag's text.
type configFile struct {
	path   string
	values map[string][]string
}

// ConfigError is a serve.toml that cannot be used: unreadable, not TOML,
// an unknown key, or a value of the wrong type or form for its key.
type ConfigError struct {
	Path string
	Key  string // "" when the file as a whole is at fault
	Err  error
}

func (e *ConfigError) Error() string {
	if e.Key == "" {
		return fmt.Sprintf("config %s: %v", e.Path, e.Err)
	}
	return fmt.Sprintf("config %s: key %q: %v", e.Path, e.Key, e.Err)
}

func (e *ConfigError) Unwrap() error { return e.Err }

// readConfig reads and checks the file at path: every key must be a
// setting, every value of its type.
func readConfig(path string) (*configFile, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, &ConfigError{Path: path, Err: err}
	}
	return parseConfig(path, b)
}

func parseConfig(path string, b []byte) (*configFile, error) {
	raw := map[string]any{}
	if err := toml.Unmarshal(b, &raw); err != nil {
		var de *toml.DecodeError
		if errors.As(err, &de) {
			line, col := de.Position()
			return nil, &ConfigError{Path: path, Err: fmt.Errorf("line %d column %d: %s", line, col, de.Error())}
		}
		return nil, &ConfigError{Path: path, Err: err}
	}
	byName := map[string]setting{}
	for _, s := range settings() {
		byName[s.name()] = s
	}
	cf := &configFile{path: path, values: map[string][]string{}}
	keys := make([]string, 0, len(raw))
	for k := range raw {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		s, ok := byName[k]
		if !ok {
			return nil, &ConfigError{Path: path, Key: k, Err: fmt.Errorf("no such setting (the keys are serve's flags: hutch serve --help)")}
		}
		vals, err := render(s.flag, raw[k])
		if err != nil {
			return nil, &ConfigError{Path: path, Key: k, Err: err}
		}
		cf.values[k] = vals
	}
	return cf, nil
}

// render is v, a TOML value, as the text of flag f, checked against the
// flag's type and form.
func render(f cli.Flag, v any) ([]string, error) {
	switch f.(type) {
	case *cli.StringFlag:
		s, ok := v.(string)
		if !ok {
			return nil, fmt.Errorf("want a string, got %s", tomlKind(v))
		}
		return []string{s}, nil
	case *cli.BoolFlag:
		b, ok := v.(bool)
		if !ok {
			return nil, fmt.Errorf("want true or false, got %s", tomlKind(v))
		}
		return []string{strconv.FormatBool(b)}, nil
	case *cli.IntFlag:
		i, ok := v.(int64)
		if !ok {
			return nil, fmt.Errorf("want an integer, got %s", tomlKind(v))
		}
		return []string{strconv.FormatInt(i, 10)}, nil
	case *cli.Float64Flag:
		switch n := v.(type) {
		case int64:
			return []string{strconv.FormatInt(n, 10)}, nil
		case float64:
			return []string{strconv.FormatFloat(n, 'g', -1, 64)}, nil
		}
		return nil, fmt.Errorf("want a number, got %s", tomlKind(v))
	case *cli.DurationFlag:
		s, ok := v.(string)
		if !ok {
			return nil, fmt.Errorf("want a duration as a string such as \"10s\", got %s", tomlKind(v))
		}
		d, err := time.ParseDuration(s)
		if err != nil {
			return nil, fmt.Errorf("want a duration such as \"10s\" or \"1m30s\": %q", s)
		}
		return []string{d.String()}, nil
	case *cli.StringSliceFlag:
		a, ok := v.([]any)
		if !ok {
			return nil, fmt.Errorf("want an array of strings, got %s", tomlKind(v))
		}
		out := make([]string, 0, len(a))
		for i, e := range a {
			s, ok := e.(string)
			if !ok {
				return nil, fmt.Errorf("element %d: want a string, got %s", i, tomlKind(e))
			}
			if strings.Contains(s, ",") {
				return nil, fmt.Errorf("element %d %q: a comma separates values; give each as its own element", i, s)
			}
			out = append(out, s)
		}
		return out, nil
	}
	return nil, fmt.Errorf("flag type %T has no serve.toml form", f)
}

func tomlKind(v any) string {
	switch v := v.(type) {
	case string:
		return fmt.Sprintf("the string %q", v)
	case bool:
		return "a boolean"
	case int64:
		return "an integer"
	case float64:
		return "a float"
	case []any:
		return "an array"
	case map[string]any:
		return "a table"
	}
	return fmt.Sprintf("a %T", v)
}

// configSource remembers which keys the config file set, so that errors
// about them name the key and the file rather than a flag.
type configSource struct {
	path    string
	fromCfg map[string]bool
}

// opt names the setting name as the operator gave it: its key in the
// config file, or its flag.
func (s *configSource) opt(name string) string {
	if s != nil && s.fromCfg[name] {
		return fmt.Sprintf("%s key %q", s.path, name)
	}
	return "--" + name
}

// applyConfig reads the config file --config names, if any, and sets each
// of its keys that no flag or environment variable set.
func applyConfig(c *cli.Context) (*configSource, error) {
	path := c.String("config")
	src := &configSource{path: path, fromCfg: map[string]bool{}}
	if path == "" {
		return src, nil
	}
	cf, err := readConfig(path)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) && !c.IsSet("config") {
			return src, nil
		}
		return nil, clix.UsageError(err)
	}
	for _, s := range settings() {
		name := s.name()
		vals, ok := cf.values[name]
		if !ok || c.IsSet(name) {
			continue
		}
		for _, v := range vals {
			if err := c.Set(name, v); err != nil {
				return nil, clix.UsageError(&ConfigError{Path: path, Key: name, Err: fmt.Errorf("%q: %w", v, err)})
			}
		}
		src.fromCfg[name] = true
	}
	return src, nil
}

// fromOutside reports whether the key name was set by a flag or an
// environment variable, which a reload of the file leaves alone.
func fromOutside(c *cli.Context, src *configSource, name string) bool {
	if src.fromCfg[name] {
		return false
	}
	return c.IsSet(name)
}

// current is the key name's value in effect, as the text serve.toml's
// values render to.
func current(c *cli.Context, s setting) []string {
	name := s.name()
	switch s.flag.(type) {
	case *cli.BoolFlag:
		return []string{strconv.FormatBool(c.Bool(name))}
	case *cli.IntFlag:
		return []string{strconv.Itoa(c.Int(name))}
	case *cli.Float64Flag:
		return []string{strconv.FormatFloat(c.Float64(name), 'g', -1, 64)}
	case *cli.DurationFlag:
		return []string{c.Duration(name).String()}
	case *cli.StringSliceFlag:
		return c.StringSlice(name)
	}
	return []string{c.String(name)}
}

// defaultValue is the flag's own default, as text.
func defaultValue(f cli.Flag) []string {
	if v, ok := flagDefaults[f]; ok {
		return v
	}
	return currentValue(f)
}

// flagDefaults holds each setting's flag default as defined, taken before
// any command line is parsed: urfave/cli writes a value it finds in the
// environment into the flag's own Value, and the file and the man page
// must show the default whatever ran before in the same process.
var flagDefaults = func() map[cli.Flag][]string {
	m := map[cli.Flag][]string{}
	for _, s := range settings() {
		m[s.flag] = currentValue(s.flag)
	}
	return m
}()

func currentValue(f cli.Flag) []string {
	switch f := f.(type) {
	case *cli.StringFlag:
		return []string{f.Value}
	case *cli.BoolFlag:
		return []string{strconv.FormatBool(f.Value)}
	case *cli.IntFlag:
		return []string{strconv.Itoa(f.Value)}
	case *cli.Float64Flag:
		return []string{strconv.FormatFloat(f.Value, 'g', -1, 64)}
	case *cli.DurationFlag:
		return []string{f.Value.String()}
	case *cli.StringSliceFlag:
		if f.Value == nil {
			return nil
		}
		return slices.Clone(f.Value.Value())
	}
	return nil
}

// keyDefault is the value of a key that neither the file nor a flag nor
// the environment sets: its flag's default, but info for log-level (a
// server logs more than hutch's other commands).
func keyDefault(s setting) []string {
	if s.name() == "log-level" {
		return []string{"info"}
	}
	return defaultValue(s.flag)
}

// DefaultConfig is the commented serve.toml that lists every key with
// its default: what `make install` puts at /etc/hutch/serve.toml. It is
// made from the flags' own definitions.
func DefaultConfig() []byte {
	var b bytes.Buffer
	b.WriteString(`# The settings of ` + "`hutch serve`" + `, read from ` + DefaultConfigPath + ` (or the
# file --config names). Every key is one of serve's flags (hutch serve
# --help), with the same name and meaning; each line below is commented
# out and shows the default. A flag on the command line, then the
# environment variable named above a key, wins over this file.
#
# SIGHUP makes a running server read this file again. It applies at once
# the keys marked "live" (log-level, default-network) and reads the
# tenants file again; it logs the other keys that changed, which need a
# restart (systemctl restart hutch-serve).
#
# Values: strings and durations ("10s", "1m30s") in quotes, numbers and
# true/false bare, repeatable flags as arrays of strings.
`)
	for _, s := range settings() {
		name := s.name()
		b.WriteString("\n")
		for _, l := range wrap(usageOf(s.flag), 72) {
			b.WriteString("# " + l + "\n")
		}
		note := "env " + strings.Join(envVars(s.flag), ", ")
		if len(envVars(s.flag)) == 0 {
			note = "no environment variable"
		}
		if liveKeys[name] {
			note += "; live"
		}
		if name == "tenants" {
			note += "; SIGHUP reads the file again, a new path needs a restart"
		}
		b.WriteString("# (" + note + ")\n")
		b.WriteString("#" + name + " = " + tomlValue(s.flag, keyDefault(s)) + "\n")
	}
	return b.Bytes()
}

func usageOf(f cli.Flag) string {
	if u, ok := f.(interface{ GetUsage() string }); ok {
		return u.GetUsage()
	}
	return ""
}

// tomlValue is vals, the text of flag f, as a TOML value.
func tomlValue(f cli.Flag, vals []string) string {
	switch f.(type) {
	case *cli.BoolFlag, *cli.IntFlag:
		return vals[0]
	case *cli.Float64Flag:
		if !strings.ContainsAny(vals[0], ".eE") {
			return vals[0] + ".0"
		}
		return vals[0]
	case *cli.StringSliceFlag:
		q := make([]string, len(vals))
		for i, v := range vals {
			q[i] = strconv.Quote(v)
		}
		return "[" + strings.Join(q, ", ") + "]"
	}
	return strconv.Quote(vals[0])
}

// wrap breaks s into lines of at most width columns, at spaces.
func wrap(s string, width int) []string {
	var lines []string
	line := ""
	for _, w := range strings.Fields(s) {
		if line != "" && len(line)+1+len(w) > width {
			lines = append(lines, line)
			line = w
			continue
		}
		if line != "" {
			line += " "
		}
		line += w
	}
	if line != "" {
		lines = append(lines, line)
	}
	return lines
}
