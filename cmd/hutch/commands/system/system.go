// Package system holds hutch's commands about itself: version, doctor, and
// the CAs its state root trusts.
package system

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"runtime"
	"runtime/debug"
	"strings"
	"time"

	"github.com/containerd/cgroups/v3"
	"github.com/urfave/cli/v2"

	"hutch.dev/hutch/cmd/hutch/commands/clix"
	"hutch.dev/hutch/engine"
	"hutch.dev/hutch/serve"
)

// Set by the build (-ldflags -X): the version, the commit and the build
// date (RFC 3339, UTC).
var (
	version   = ""
	commit    = ""
	buildDate = ""
)

// Version is hutch's version: the build's stamp, else the module version.
func Version() string {
	if version != "" {
		return version
	}
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		return bi.Main.Version
	}
	return "dev"
}

// Info is what a hutch build is: `hutch version`, `hutch --version`, and
// the API's GET /version.
type Info struct {
	serve.Version
	// RunscPath is where the runsc of Runsc was found.
	RunscPath string `json:"runscPath,omitempty"`
}

// BuildInfo is this build's Info, without runsc's version.
func BuildInfo() Info {
	i := Info{Version: serve.Version{Version: Version(), Commit: commit, BuildDate: buildDate, Go: runtime.Version(), Platform: runtime.GOOS + "/" + runtime.GOARCH}}
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" && i.Commit == "" {
				i.Commit = s.Value
			}
		}
	}
	if i.Commit == "" {
		i.Commit = "unknown"
	}
	if i.BuildDate == "" {
		i.BuildDate = "unknown"
	}
	return i
}

// RunscInfo is this build's Info with the version of the runsc the
// global flags name, or the error finding or running it. It opens no
// state root.
func RunscInfo(c *cli.Context) (Info, error) {
	i := BuildInfo()
	var err error
	i.Runsc, i.RunscPath, err = engine.RunscVersion(c.Context, c.String("runsc"))
	return i, err
}

// Write writes i as `hutch version` prints it: "hutch VERSION" first.
func (i Info) Write(w io.Writer) {
	fmt.Fprintf(w, "hutch %s\n", i.Version.Version)
	fmt.Fprintf(w, "  commit:  %s\n", i.Commit)
	fmt.Fprintf(w, "  built:   %s\n", i.BuildDate)
	fmt.Fprintf(w, "  go:      %s %s\n", i.Go, i.Platform)
	if i.Runsc != "" {
		fmt.Fprintf(w, "  runsc:   %s (%s)\n", i.Runsc, i.RunscPath)
	}
}

// PrintVersion is --version: what `hutch version` prints, with why runsc
// was not found instead of its version if it was not.
func PrintVersion(c *cli.Context) {
	i, err := RunscInfo(c)
	i.Write(c.App.Writer)
	if err != nil {
		fmt.Fprintf(c.App.Writer, "  runsc:   not found: %v\n", err)
	}
}

// Commands are version, doctor, ca and migrate.
var Commands = []*cli.Command{versionCommand, doctorCommand, caCommand, secretCommand, resolverCommand, migrateCommand}

var versionCommand = &cli.Command{
	Name:  "version",
	Usage: "print the versions of hutch (commit, build date, Go) and runsc",
	Flags: []cli.Flag{clix.FormatFlag},
	Action: func(c *cli.Context) error {
		asJSON, err := clix.CheckFormat(c)
		if err != nil {
			return err
		}
		i, err := RunscInfo(c)
		if err != nil {
			return err
		}
		if asJSON {
			return clix.WriteJSON(c.App.Writer, i)
		}
		i.Write(c.App.Writer)
		return nil
	},
}

var doctorCommand = &cli.Command{
	Name:  "doctor",
	Usage: "check that this host can run sandboxes, by running one",
	Action: func(c *cli.Context) error {
		w := c.App.Writer
		failed := 0
		check := func(name string, fn func() (string, error)) {
			detail, err := fn()
			if err != nil {
				failed++
				fmt.Fprintf(w, "FAIL  %-10s %v\n", name, err)
				return
			}
			fmt.Fprintf(w, "ok    %-10s %s\n", name, detail)
		}
		var e *engine.Engine
		check("state", func() (string, error) {
			var err error
			e, err = clix.Engine(c)
			if err != nil {
				return "", err
			}
			mode := "root"
			if e.Rootless() {
				mode = "rootless"
			}
			return fmt.Sprintf("%s (%s)", e.Root(), mode), nil
		})
		if e == nil {
			return clix.Exit(clix.ExitRuntime, fmt.Errorf("doctor: %d check(s) failed", failed))
		}
		check("runsc", func() (string, error) {
			v, err := e.Version(c.Context)
			return v + " at " + e.RunscPath(), err
		})
		if e.Rootless() {
			for _, it := range rootlessReport(c.Context, e) {
				switch {
				case it.ok:
					fmt.Fprintf(w, "ok    %-10s %s\n", it.name, it.detail)
				case it.fatal:
					failed++
					fmt.Fprintf(w, "FAIL  %-10s %s\n", it.name, it.detail)
				default:
					fmt.Fprintf(w, "note  %-10s %s\n", it.name, it.detail)
				}
				if !it.ok && it.fix != "" {
					fmt.Fprintf(w, "      %-10s fix: %s\n", "", it.fix)
				}
			}
		}
		check("cgroups", func() (string, error) {
			if e.Rootless() {
				return "none of root's; see limits above", nil
			}
			switch cgroups.Mode() {
			case cgroups.Unified:
				return "v2", nil
			case cgroups.Hybrid:
				return "v1 + v2 (hybrid)", nil
			case cgroups.Legacy:
				return "v1", nil
			}
			return "", fmt.Errorf("no cgroup hierarchy found")
		})
		check("sandbox", func() (string, error) {
			ctx, cancel := context.WithTimeout(c.Context, 60*time.Second)
			defer cancel()
			start := time.Now()
			sb, err := e.Create(ctx, engine.CreateRequest{Image: engine.TestImage})
			if err != nil {
				return "", err
			}
			defer e.Remove(context.Background(), sb.ID, true) //nolint:errcheck // reported below if it matters
			var out, errb bytes.Buffer
			code, err := e.Exec(ctx, sb.ID, engine.ExecRequest{Args: []string{"uname", "-sr"}, Stdout: &out, Stderr: &errb})
			if err != nil || code != 0 {
				return "", fmt.Errorf("exec uname: status %d: %v %s", code, err, strings.TrimSpace(errb.String()))
			}
			return fmt.Sprintf("%s (create+exec %s)", strings.TrimSpace(out.String()), time.Since(start).Round(time.Millisecond)), nil
		})
		check("base", func() (string, error) {
			if img, err := e.Images().Get(c.Context, engine.DefaultImage); err == nil {
				return fmt.Sprintf("%s built (%s)", img.Name, engine.FormatSize(img.Size)), nil
			}
			if e.Rootless() {
				return engine.DefaultImage + " not in your store: see images above", nil
			}
			return engine.DefaultImage + " not built yet: the first sandbox without --image builds it", nil
		})
		if detail, notes := hostCAs(c, e); len(notes) == 0 {
			fmt.Fprintf(w, "ok    %-10s %s\n", "host CAs", detail)
		} else {
			fmt.Fprintf(w, "note  %-10s %s\n", "host CAs", notes[0])
			for _, n := range notes[1:] {
				fmt.Fprintf(w, "      %-10s %s\n", "", n)
			}
		}
		if failed > 0 {
			return clix.Exit(clix.ExitRuntime, fmt.Errorf("doctor: %d check(s) failed", failed))
		}
		return nil
	},
}

var migrateCommand = &cli.Command{
	Name:  "migrate",
	Usage: "move the state of " + engine.FormerName + " (this project's former name) to hutch's paths",
	Description: "Moves " + engine.FormerName + "'s default state root (as root, also its shared image store\n" +
		"and /etc directory) to hutch's default paths, and rewrites the paths its\n" +
		"records hold. Stop or pause running sandboxes first.",
	Action: func(c *cli.Context) error {
		if _, err := clix.Args(c, 0, 0, ""); err != nil {
			return err
		}
		if c.String("root") != "" {
			return clix.UsageError(fmt.Errorf("migrate moves the default state root: it takes no --root"))
		}
		done, err := engine.MigrateFormerState(c.Context, engine.Options{RunscPath: c.String("runsc")})
		for _, m := range done {
			fmt.Fprintf(c.App.Writer, "moved %s to %s (%d files rewritten)\n", m.From, m.To, m.Rewritten)
		}
		return err
	},
}
