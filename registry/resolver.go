package registry

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net/http"
	"slices"

	"github.com/containerd/containerd/v2/core/remotes"
	"github.com/containerd/containerd/v2/core/remotes/docker"
	remoteerrors "github.com/containerd/containerd/v2/core/remotes/errors"
	"github.com/containerd/errdefs"
	"github.com/distribution/reference"
)

// Options say how to reach registries.
type Options struct {
	// Credentials find the user and secret for a host; nil: anonymous.
	Credentials *Credentials
	// Insecure are registry hosts (host[:port]) reached over plain HTTP,
	// without TLS: registries on loopback, typically.
	Insecure []string
	// Client makes the HTTP requests; nil: one with docker's defaults
	// (proxies from the environment, HTTP/2, timeouts).
	Client *http.Client
	// RootCAs, if set, are the certificate authorities registries' TLS
	// certificates are checked against (when Client is nil): the
	// system's plus the extra ones hutch was given.
	RootCAs *x509.CertPool
}

// httpClient is o.Client, or docker's default client trusting o.RootCAs,
// or nil for containerd's default.
func (o Options) httpClient() *http.Client {
	if o.Client != nil || o.RootCAs == nil {
		return o.Client
	}
	return &http.Client{Transport: docker.DefaultHTTPTransport(&tls.Config{RootCAs: o.RootCAs, MinVersion: tls.VersionTLS12})}
}

// hosts are containerd's registry hosts for o: docker.io maps to its
// registry host, o.Insecure hosts use http, and every request is
// authorized with o.Credentials.
func (o Options) hosts() docker.RegistryHosts {
	var lookup func(string) (string, string, error)
	if o.Credentials != nil {
		lookup = o.Credentials.Lookup
	}
	return o.hostsWith(lookup)
}

// hostsWith is hosts with the credentials lookup returns.
func (o Options) hostsWith(lookup func(host string) (user, secret string, err error)) docker.RegistryHosts {
	client := o.httpClient()
	authOpts := []docker.AuthorizerOpt{}
	if client != nil {
		authOpts = append(authOpts, docker.WithAuthClient(client))
	}
	if lookup != nil {
		authOpts = append(authOpts, docker.WithAuthCreds(lookup))
	}
	regOpts := []docker.RegistryOpt{
		docker.WithAuthorizer(docker.NewDockerAuthorizer(authOpts...)),
		docker.WithPlainHTTP(func(host string) (bool, error) {
			return slices.Contains(o.Insecure, host), nil
		}),
	}
	if client != nil {
		regOpts = append(regOpts, docker.WithClient(client))
	}
	return docker.ConfigureDefaultRegistries(regOpts...)
}

func (o Options) resolver() remotes.Resolver {
	return docker.NewResolver(docker.ResolverOptions{Hosts: o.hosts()})
}

// domainOf is the registry host of a normalized reference.
func domainOf(ref string) string {
	named, err := reference.ParseNormalizedNamed(ref)
	if err != nil {
		return ""
	}
	return reference.Domain(named)
}

// explain turns the registry protocol's errors into errdefs classes with a
// message that says what to do: refused credentials, a missing image, a
// plain-HTTP registry reached with TLS.
func explain(op, ref string, err error) error {
	return explainHost(op, ref, domainOf(ref), err)
}

// explainHost is explain for a reference (or host) ref on host.
func explainHost(op, ref, host string, err error) error {
	var (
		status    remoteerrors.ErrUnexpectedStatus
		unknownCA x509.UnknownAuthorityError
	)
	switch {
	case errors.As(err, &unknownCA):
		return fmt.Errorf("%s %s: the certificate of %s is signed by an authority hutch does not trust "+
			"(pass --ca-cert FILE, or trust it for the state root with hutch ca add FILE): %w",
			op, ref, host, err)
	case errors.Is(err, docker.ErrInvalidAuthorization),
		errors.As(err, &status) && status.StatusCode == http.StatusUnauthorized:
		return fmt.Errorf("%s %s: %s refused the credentials (or needs some: hutch login %s): %v: %w",
			op, ref, host, host, err, errdefs.ErrUnauthenticated)
	case errors.As(err, &status) && status.StatusCode == http.StatusForbidden:
		return fmt.Errorf("%s %s: %s denied access: %v: %w", op, ref, host, err, errdefs.ErrPermissionDenied)
	case errors.As(err, &status) && status.StatusCode == http.StatusNotFound:
		return fmt.Errorf("%s %s: not found in %s: %v: %w", op, ref, host, err, errdefs.ErrNotFound)
	case errors.Is(err, http.ErrSchemeMismatch):
		return fmt.Errorf("%s %s: %s speaks plain HTTP (pass --insecure-registry %s if that is intended): %w",
			op, ref, host, host, err)
	}
	return fmt.Errorf("%s %s: %w", op, ref, err)
}

// ping checks that host accepts the credentials lookup gives: GET /v2/,
// and if the registry asks for authorization, again with it.
func ping(ctx context.Context, o Options, host string, lookup func(string) (string, string, error)) error {
	hosts, err := o.hostsWith(lookup)(host)
	if err != nil {
		return err
	}
	if len(hosts) == 0 {
		return fmt.Errorf("no registry host for %s: %w", host, errdefs.ErrNotFound)
	}
	h := hosts[0]
	url := h.Scheme + "://" + h.Host + h.Path + "/"
	client := h.Client
	if client == nil {
		client = http.DefaultClient
	}
	do := func() (*http.Response, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return nil, err
		}
		if err := h.Authorizer.Authorize(ctx, req); err != nil {
			return nil, err
		}
		return client.Do(req)
	}
	resp, err := do()
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode == http.StatusUnauthorized {
		if err := h.Authorizer.AddResponses(ctx, []*http.Response{resp}); err != nil {
			return err
		}
		if resp, err = do(); err != nil {
			return err
		}
		resp.Body.Close()
	}
	if resp.StatusCode/100 != 2 {
		return remoteerrors.NewUnexpectedStatusErr(resp)
	}
	return nil
}

// Login checks user and secret against host and, if the registry accepts
// them, stores them in o.Credentials's file.
func Login(ctx context.Context, o Options, host, user, secret string) error {
	if err := ValidHost(host); err != nil {
		return err
	}
	if user == "" || secret == "" {
		return fmt.Errorf("login to %s: user name and password must not be empty: %w", host, errdefs.ErrInvalidArgument)
	}
	if o.Credentials == nil || o.Credentials.File == "" {
		return fmt.Errorf("login to %s: no credential file: %w", host, errdefs.ErrInvalidArgument)
	}
	lookup := func(string) (string, string, error) { return user, secret, nil }
	if err := ping(ctx, o, host, lookup); err != nil {
		return explainHost("login to", host, host, err)
	}
	return o.Credentials.Store(host, user, secret)
}

// Logout removes host's credentials from o.Credentials's file.
func Logout(o Options, host string) error {
	if err := ValidHost(host); err != nil {
		return err
	}
	if o.Credentials == nil || o.Credentials.File == "" {
		return fmt.Errorf("logout from %s: no credential file: %w", host, errdefs.ErrInvalidArgument)
	}
	return o.Credentials.Erase(host)
}
