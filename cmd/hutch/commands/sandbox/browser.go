package sandbox

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/urfave/cli/v2"

	"hutch.dev/hutch/browser"
	"hutch.dev/hutch/cmd/hutch/commands/clix"
	"hutch.dev/hutch/engine"
)

var browserCommand = &cli.Command{
	Name:  "browser",
	Usage: "start the sandbox's Chromium and serve its DevTools (CDP) endpoint on the host until interrupted",
	Description: "Starts Chromium in the sandbox (headless, or on the desktop's screen with --display :0), with its DevTools " +
		"protocol on 127.0.0.1:9222 inside the sandbox only, and listens on --listen on the host. " +
		"The first line printed is the one URL Playwright's connectOverCDP and Puppeteer's connect take: " +
		"ws://ADDR/devtools/browser?hutch_token=TOKEN, with a token of this run's own that every request must carry. " +
		"Ends on SIGINT or SIGTERM; the browser runs on in the sandbox.",
	ArgsUsage: "ID",
	Flags: []cli.Flag{
		&cli.StringFlag{Name: "listen", Value: "127.0.0.1:0", Usage: "host address to serve the endpoint on (port 0: any free port)"},
		&cli.StringFlag{Name: "display", Usage: "an X display of the sandbox to show the browser on, such as :0 (the desktop template's); default headless"},
		&cli.StringFlag{Name: "format", Usage: "json: print the endpoint as JSON (cdpUrl, token, listen)"},
	},
	Action: func(c *cli.Context) error {
		a, err := clix.Args(c, 1, 1, "ID")
		if err != nil {
			return err
		}
		asJSON, err := clix.CheckFormat(c)
		if err != nil {
			return err
		}
		display := c.String("display")
		if display != "" && !browser.ValidDisplay(display) {
			return clix.UsageError(fmt.Errorf("--display %q: want an X display such as :0", display))
		}
		e, err := clix.Engine(c)
		if err != nil {
			return err
		}
		ctx, cancel := signal.NotifyContext(c.Context, os.Interrupt, syscall.SIGTERM)
		defer cancel()
		if err := startBrowser(ctx, e, a[0], display); err != nil {
			return err
		}
		l, err := net.Listen("tcp", c.String("listen"))
		if err != nil {
			return clix.UsageError(fmt.Errorf("--listen %s: %w", c.String("listen"), err))
		}
		defer l.Close()
		d, err := e.PortDialer(ctx, a[0])
		if err != nil {
			return clix.Exit(clix.ExitRuntime, err)
		}
		defer d.Close()
		tok := make([]byte, 20)
		_, _ = rand.Read(tok)
		token := hex.EncodeToString(tok)
		tr := browser.DialTransport(func(context.Context) (net.Conn, error) { return d.Dial(browser.Port) })
		defer tr.CloseIdleConnections()
		p := &browser.Proxy{Transport: tr, Token: token}
		srv := &http.Server{
			Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if !browser.Check(r, token) {
					http.Error(w, "this DevTools endpoint needs the token of the URL hutch browser printed ("+browser.TokenParam+")", http.StatusForbidden)
					return
				}
				p.ServeHTTP(w, r)
			}),
			ReadHeaderTimeout: 10 * time.Second,
		}
		u := browser.URL("ws", l.Addr().String(), token)
		if asJSON {
			b, _ := json.Marshal(map[string]any{"cdpUrl": u, "token": token, "listen": l.Addr().String(), "display": display})
			fmt.Fprintln(c.App.Writer, string(b))
		} else {
			fmt.Fprintln(c.App.Writer, u)
		}
		if f, ok := c.App.Writer.(*os.File); ok {
			_ = f.Sync()
		}
		fmt.Fprintf(c.App.ErrWriter, "serving the DevTools of sandbox %s's browser on %s until interrupted\n", a[0], l.Addr())
		go func() {
			<-ctx.Done()
			sctx, scancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer scancel()
			_ = srv.Shutdown(sctx)
		}()
		if err := srv.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
			return clix.Exit(clix.ExitRuntime, err)
		}
		return nil
	},
}

// startBrowser runs the sandbox's hutch-browser, which starts Chromium
// unless it runs already and waits until its DevTools answer.
func startBrowser(ctx context.Context, e *engine.Engine, ref, display string) error {
	var out bytes.Buffer
	code, err := e.Exec(ctx, ref, engine.ExecRequest{Args: browser.StartCommand(display), Stdout: &out, Stderr: &out})
	switch {
	case err != nil && strings.Contains(err.Error(), "hutch-browser"):
		return clix.Exit(clix.ExitRuntime, fmt.Errorf("sandbox %s has no browser to start (a sandbox of --image desktop has one): %w", ref, err))
	case err != nil:
		return clix.Exit(clix.ExitRuntime, err)
	case code == 127:
		return clix.Exit(clix.ExitRuntime, fmt.Errorf("sandbox %s has no browser to start (a sandbox of --image desktop has one)", ref))
	case code != 0:
		return clix.Exit(clix.ExitRuntime, fmt.Errorf("sandbox %s: starting its browser: exit %d: %s", ref, code, strings.TrimSpace(out.String())))
	}
	return nil
}
