package serve

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/coreos/go-systemd/v22/daemon"
	"github.com/urfave/cli/v2"
	"golang.org/x/sys/unix"

	"hutch.dev/hutch/serve/certs"
)

// tlsChoice is what the TLS flags ask for: files, a development CA, or
// plain HTTP (neither).
type tlsChoice struct {
	cert, key  string
	selfSigned bool
}

// tlsFlags reads the TLS flags: --tls-cert and --tls-key together, or
// --tls-self-signed alone, or none.
func tlsFlags(c *cli.Context) (tlsChoice, error) {
	t := tlsChoice{cert: c.String("tls-cert"), key: c.String("tls-key"), selfSigned: c.Bool("tls-self-signed")}
	switch {
	case t.selfSigned && (t.cert != "" || t.key != ""):
		return t, errors.New("--tls-self-signed makes its own certificate: give it without --tls-cert and --tls-key")
	case (t.cert == "") != (t.key == ""):
		return t, errors.New("--tls-cert and --tls-key go together: give both, the certificate's PEM file and its key's")
	}
	return t, nil
}

// load is the reloader of the certificate the flags ask for, nil for
// plain HTTP. A development CA lives in dir; the first time it is made,
// how to trust it is printed.
func (t tlsChoice) load(c *cli.Context, dir, domain string, log *slog.Logger) (*certs.Reloader, error) {
	switch {
	case t.cert != "":
		r, err := certs.NewReloader(t.cert, t.key, domain)
		if err != nil {
			return nil, fmt.Errorf("--tls-cert: %w", err)
		}
		if w := certs.Expired(r.Certificate().Leaf); w != "" {
			log.Warn(w, "cert", t.cert)
		}
		return r, nil
	case t.selfSigned:
		f, err := certs.Dev(dir, domain)
		if err != nil {
			return nil, fmt.Errorf("--tls-self-signed: %w", err)
		}
		if f.NewCA {
			fmt.Fprintf(c.App.ErrWriter, `hutch serve: made a development CA for %[1]s; its certificate for %[1]s and *.%[1]s is
signed by it. Clients must trust the CA (it can sign for %[1]s and loopback only):

    Node (the e2b SDK):  NODE_EXTRA_CA_CERTS=%[2]s
    Python (e2b):        SSL_CERT_FILE=%[2]s (or REQUESTS_CA_BUNDLE)
    curl:                curl --cacert %[2]s ...
    this host (Debian):  cp %[2]s /usr/local/share/ca-certificates/hutch-%[1]s.crt && update-ca-certificates

`, domain, f.CA)
		}
		if f.NewCert {
			log.Info("issued a development certificate", "domain", domain, "cert", f.Cert, "ca", f.CA)
		}
		r, err := certs.NewReloader(f.Cert, f.Key, domain)
		if err != nil {
			return nil, fmt.Errorf("--tls-self-signed: %w", err)
		}
		return r, nil
	}
	return nil, nil
}

// reloadOnHangup reads the config file and the certificate files again
// on each SIGHUP until ctx ends. New connections get the new certificate,
// open ones keep theirs; a pair that does not load leaves the old one
// served.
func reloadOnHangup(ctx context.Context, r *certs.Reloader, live *liveConfig, log *slog.Logger) {
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	for {
		select {
		case <-ctx.Done():
			return
		case <-hup:
		}
		notify(log, daemon.SdNotifyReloading, fmt.Sprintf("MONOTONIC_USEC=%d", monotonicUsec()))
		live.reload()
		reloadCert(r, log)
		notify(log, daemon.SdNotifyReady, "STATUS=reloaded")
	}
}

// reloadCert loads the certificate files of r again, if any.
func reloadCert(r *certs.Reloader, log *slog.Logger) {
	if r == nil {
		return
	}
	if err := r.Reload(); err != nil {
		log.Error("SIGHUP: the TLS certificate did not reload; the old one is still served", "error", err)
		return
	}
	leaf := r.Certificate().Leaf
	log.Info("SIGHUP: reloaded the TLS certificate", "serial", leaf.SerialNumber.Text(16), "not_after", leaf.NotAfter)
	if w := certs.Expired(leaf); w != "" {
		log.Warn(w)
	}
}

// monotonicUsec is CLOCK_MONOTONIC in microseconds, which systemd wants
// with RELOADING=1.
func monotonicUsec() int64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		return 0
	}
	return ts.Nano() / 1000
}
