package sandbox

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/urfave/cli/v2"

	"hutch.dev/hutch/client"
	"hutch.dev/hutch/cmd/hutch/commands/clix"
	"hutch.dev/hutch/engine"
)

// codeClient is the code interpreter of sandbox ref, reached through
// the engine's dialer into the sandbox's port (no network needed). stop
// ends its connections.
func codeClient(c *cli.Context, e *engine.Engine, ref string) (*client.Code, func(), error) {
	ctx, cancel := context.WithCancel(c.Context)
	d, err := e.PortDialer(ctx, ref)
	if err != nil {
		cancel()
		return nil, nil, err
	}
	tr := &http.Transport{
		DialContext: func(context.Context, string, string) (net.Conn, error) {
			return d.Dial(client.CodePort)
		},
	}
	return &client.Code{BaseURL: "http://sandbox", HTTP: &http.Client{Transport: tr}}, func() {
		tr.CloseIdleConnections()
		d.Close()
		cancel()
	}, nil
}

// codeError says what failed when the sandbox has no code interpreter.
func codeError(ref string, err error) error {
	var ce *client.Error
	if errors.As(err, &ce) {
		return clix.Exit(clix.ExitRuntime, fmt.Errorf("the code interpreter of sandbox %s: %s", ref, ce.Message))
	}
	return clix.Exit(clix.ExitRuntime, fmt.Errorf("sandbox %s: no code interpreter answers on port %d (a sandbox of --image code-interpreter-v1 has one): %w", ref, client.CodePort, err))
}

var codeCommand = &cli.Command{
	Name:  "code",
	Usage: "run code in a context of the sandbox's code interpreter, which keeps its state between calls",
	Description: "CODE is run in the default context of --language (python unless given), or in --context. " +
		"Its output is printed as it comes; its results as text, images and other formats as files with --save DIR. " +
		"Exits 0, or 1 if the code raised an error. CODE - reads the code from standard input.",
	ArgsUsage: "ID CODE",
	Flags: []cli.Flag{
		&cli.StringFlag{Name: "language", Aliases: []string{"l"}, Usage: "python, javascript, typescript or bash (default python)"},
		&cli.StringFlag{Name: "context", Usage: "a context ID (hutch code-context create); not with --language"},
		&cli.StringSliceFlag{Name: "env", Aliases: []string{"e"}, Usage: "environment KEY=VALUE for this run only"},
		&cli.StringFlag{Name: "save", Usage: "write each result's images, HTML and other formats to files in this host directory"},
		&cli.StringFlag{Name: "format", Usage: "json: print the execution (results, logs, error) as JSON at its end"},
	},
	Action: func(c *cli.Context) error {
		a, err := clix.Args(c, 2, 2, "ID CODE")
		if err != nil {
			return err
		}
		asJSON, err := clix.CheckFormat(c)
		if err != nil {
			return err
		}
		lang, cctx := c.String("language"), c.String("context")
		if lang != "" && cctx != "" {
			return clix.UsageError(errors.New("--language and --context: give one, a context has its language"))
		}
		if lang != "" && !client.IsLanguage(lang) {
			return clix.UsageError(fmt.Errorf("--language %q: want one of %s", lang, strings.Join(client.Languages, ", ")))
		}
		env, err := clix.KeyValues("env", c.StringSlice("env"))
		if err != nil {
			return err
		}
		code := a[1]
		if code == "-" {
			b, err := io.ReadAll(os.Stdin)
			if err != nil {
				return clix.Exit(clix.ExitRuntime, err)
			}
			code = string(b)
		}
		save := c.String("save")
		if save != "" {
			if st, err := os.Stat(save); err != nil || !st.IsDir() {
				return clix.UsageError(fmt.Errorf("--save %s: want an existing directory", save))
			}
		}
		e, err := clix.Engine(c)
		if err != nil {
			return err
		}
		cl, stop, err := codeClient(c, e, a[0])
		if err != nil {
			return clix.Exit(clix.ExitRuntime, err)
		}
		defer stop()
		ctx, cancel := signal.NotifyContext(c.Context, os.Interrupt, syscall.SIGTERM)
		defer cancel()
		out, errw := c.App.Writer, c.App.ErrWriter
		n := 0
		x, err := cl.Execute(ctx, client.CodeRequest{Code: code, Language: lang, ContextID: cctx, EnvVars: env}, func(o client.CodeOutput) {
			if asJSON {
				return
			}
			switch o.Type {
			case "stdout":
				fmt.Fprint(out, o.Text)
			case "stderr":
				fmt.Fprint(errw, o.Text)
			case "result":
				n++
				printResult(out, errw, o.Result, save, n)
			case "error":
				fmt.Fprintln(errw, o.Error.Traceback)
				if o.Error.Traceback == "" || !strings.Contains(o.Error.Traceback, o.Error.Value) {
					fmt.Fprintf(errw, "%s: %s\n", o.Error.Name, o.Error.Value)
				}
			}
		})
		if err != nil {
			if ctx.Err() != nil {
				return clix.Exit(130, errors.New("interrupted: the code was stopped"))
			}
			return codeError(a[0], err)
		}
		if asJSON {
			if err := clix.WriteJSON(out, x); err != nil {
				return err
			}
		}
		if x.Error != nil {
			return clix.Exit(1, nil)
		}
		return nil
	},
}

// printResult prints a result's text; its other formats are written to
// files in dir (when given) and named.
func printResult(out, errw io.Writer, r *client.CodeResult, dir string, n int) {
	if r.Text != "" {
		fmt.Fprintln(out, r.Text)
	}
	files := []struct {
		ext, data string
		b64       bool
	}{{"png", r.PNG, true}, {"jpeg", r.JPEG, true}, {"pdf", r.PDF, true}, {"svg", r.SVG, false}, {"html", r.HTML, false}, {"md", r.Markdown, false}, {"tex", r.LaTeX, false}, {"js", r.JavaScript, false}}
	for _, f := range files {
		if f.data == "" {
			continue
		}
		if dir == "" {
			fmt.Fprintf(errw, "[result %d has %s; --save DIR writes it to a file]\n", n, f.ext)
			continue
		}
		b := []byte(f.data)
		if f.b64 {
			var err error
			if b, err = base64.StdEncoding.DecodeString(strings.TrimSpace(f.data)); err != nil {
				fmt.Fprintf(errw, "result %d: its %s is not base64: %v\n", n, f.ext, err)
				continue
			}
		}
		p := fmt.Sprintf("%s/result-%d.%s", strings.TrimRight(dir, "/"), n, f.ext)
		if err := os.WriteFile(p, b, 0o644); err != nil {
			fmt.Fprintf(errw, "result %d: %v\n", n, err)
			continue
		}
		fmt.Fprintf(errw, "[result %d: %s]\n", n, p)
	}
	for _, d := range []struct {
		name string
		v    []byte
	}{{"data", r.Data}, {"chart", r.Chart}, {"json", r.JSON}} {
		if len(d.v) == 0 {
			continue
		}
		if dir == "" {
			fmt.Fprintf(errw, "[result %d has %s; --save DIR writes it to a file]\n", n, d.name)
			continue
		}
		p := fmt.Sprintf("%s/result-%d.%s.json", strings.TrimRight(dir, "/"), n, d.name)
		if err := os.WriteFile(p, d.v, 0o644); err != nil {
			fmt.Fprintf(errw, "result %d: %v\n", n, err)
			continue
		}
		fmt.Fprintf(errw, "[result %d: %s]\n", n, p)
	}
}

var codeContextCommand = &cli.Command{
	Name:  "code-context",
	Usage: "manage the contexts of a sandbox's code interpreter",
	Subcommands: []*cli.Command{
		{
			Name:      "create",
			Usage:     "start a context; prints its ID",
			ArgsUsage: "ID",
			Flags: []cli.Flag{
				&cli.StringFlag{Name: "language", Aliases: []string{"l"}, Usage: "python, javascript, typescript or bash (default python)"},
				&cli.StringFlag{Name: "cwd", Usage: "its working directory in the sandbox (default /home/user)"},
			},
			Action: func(c *cli.Context) error {
				a, err := clix.Args(c, 1, 1, "ID")
				if err != nil {
					return err
				}
				if l := c.String("language"); l != "" && !client.IsLanguage(l) {
					return clix.UsageError(fmt.Errorf("--language %q: want one of %s", l, strings.Join(client.Languages, ", ")))
				}
				return withCode(c, a[0], func(cl *client.Code) error {
					cc, err := cl.CreateContext(c.Context, c.String("language"), c.String("cwd"))
					if err != nil {
						return err
					}
					fmt.Fprintln(c.App.Writer, cc.ID)
					return nil
				})
			},
		},
		{
			Name:      "ls",
			Usage:     "list the contexts",
			ArgsUsage: "ID",
			Flags:     []cli.Flag{&cli.StringFlag{Name: "format", Usage: "json"}},
			Action: func(c *cli.Context) error {
				a, err := clix.Args(c, 1, 1, "ID")
				if err != nil {
					return err
				}
				asJSON, err := clix.CheckFormat(c)
				if err != nil {
					return err
				}
				return withCode(c, a[0], func(cl *client.Code) error {
					cs, err := cl.ListContexts(c.Context)
					if err != nil {
						return err
					}
					if asJSON {
						return clix.WriteJSON(c.App.Writer, cs)
					}
					return clix.WriteTable(c.App.Writer, 3, []string{"CONTEXT", "LANGUAGE", "CWD"}, cs, func(x client.CodeContext) []string {
						return []string{x.ID, x.Language, x.Cwd}
					})
				})
			},
		},
		{
			Name:      "restart",
			Usage:     "restart a context: its state is gone",
			ArgsUsage: "ID CONTEXT",
			Action: func(c *cli.Context) error {
				a, err := clix.Args(c, 2, 2, "ID CONTEXT")
				if err != nil {
					return err
				}
				return withCode(c, a[0], func(cl *client.Code) error { return cl.RestartContext(c.Context, a[1]) })
			},
		},
		{
			Name:      "rm",
			Usage:     "end a context",
			ArgsUsage: "ID CONTEXT",
			Action: func(c *cli.Context) error {
				a, err := clix.Args(c, 2, 2, "ID CONTEXT")
				if err != nil {
					return err
				}
				return withCode(c, a[0], func(cl *client.Code) error { return cl.RemoveContext(c.Context, a[1]) })
			},
		},
	},
}

// withCode runs f with the code interpreter of sandbox ref.
func withCode(c *cli.Context, ref string, f func(*client.Code) error) error {
	e, err := clix.Engine(c)
	if err != nil {
		return err
	}
	cl, stop, err := codeClient(c, e, ref)
	if err != nil {
		return clix.Exit(clix.ExitRuntime, err)
	}
	defer stop()
	if err := f(cl); err != nil {
		return codeError(ref, err)
	}
	return nil
}
