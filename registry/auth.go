package registry

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/containerd/errdefs"
	"github.com/docker/cli/cli/config"
	"github.com/docker/cli/cli/config/configfile"
	"github.com/docker/cli/cli/config/types"
)

// dockerHubHost is the registry host of docker.io references, and
// dockerHubKey the key docker's config files use for it.
const (
	dockerHubDomain = "docker.io"
	dockerHubHost   = "registry-1.docker.io"
	dockerHubKey    = "https://index.docker.io/v1/"
)

// AuthFile is the name of hutch's own credential file in the state root.
const AuthFile = "auth.json"

// Credentials finds the user name and secret for a registry host.
type Credentials struct {
	// File is hutch's own credential file (docker's config format, mode
	// 0600), written by Login. Empty: none.
	File string
	// DockerConfigDir holds docker's config.json; empty means docker's
	// default ($DOCKER_CONFIG, else ~/.docker). "-" reads no docker config.
	DockerConfigDir string
}

// NewCredentials returns the credentials of the state root root: its own
// file first, then docker's config.
func NewCredentials(root string) *Credentials {
	return &Credentials{File: filepath.Join(root, AuthFile)}
}

// authKey is the key host has in a config file.
func authKey(host string) string {
	if host == dockerHubDomain || host == dockerHubHost || host == "index.docker.io" {
		return dockerHubKey
	}
	return host
}

// Lookup returns the credentials for host ("ghcr.io", "127.0.0.1:5000",
// "docker.io"): from hutch's own file, else docker's config and its credential
// helpers. No credentials anywhere is not an error: user and secret are
// empty. A secret with an empty user is an identity token.
func (c *Credentials) Lookup(host string) (user, secret string, err error) {
	key := authKey(host)
	if c.File != "" {
		cf, err := c.loadOwn()
		if err != nil {
			return "", "", err
		}
		if ac, ok := cf.GetAuthConfigs()[key]; ok {
			if u, s := fromAuthConfig(ac); s != "" {
				return u, s, nil
			}
		}
	}
	if c.DockerConfigDir == "-" {
		return "", "", nil
	}
	dir := c.DockerConfigDir
	if dir == "" {
		dir = config.Dir()
	}
	cf, err := config.Load(dir)
	if err != nil {
		return "", "", fmt.Errorf("docker config in %s: %w", dir, err)
	}
	ac, err := cf.GetAuthConfig(key)
	if err != nil {
		return "", "", fmt.Errorf("credentials for %s from docker's config in %s: %w", host, dir, err)
	}
	u, s := fromAuthConfig(ac)
	return u, s, nil
}

func fromAuthConfig(ac types.AuthConfig) (user, secret string) {
	if ac.IdentityToken != "" {
		return "", ac.IdentityToken
	}
	return ac.Username, ac.Password
}

// loadOwn reads hutch's credential file; a missing file is an empty one.
func (c *Credentials) loadOwn() (*configfile.ConfigFile, error) {
	cf := configfile.New(c.File)
	f, err := os.Open(c.File)
	if errors.Is(err, fs.ErrNotExist) {
		return cf, nil
	}
	if err != nil {
		return nil, fmt.Errorf("credential file: %w", err)
	}
	defer f.Close()
	if err := cf.LoadFromReader(f); err != nil {
		return nil, fmt.Errorf("credential file %s: %v: %w", c.File, err, errdefs.ErrDataLoss)
	}
	return cf, nil
}

// Store saves user and secret for host in hutch's own file, replacing what
// it had for host. The file is written whole, by rename, with mode 0600.
func (c *Credentials) Store(host, user, secret string) error {
	if err := ValidHost(host); err != nil {
		return err
	}
	if user == "" || secret == "" {
		return fmt.Errorf("login to %s: user name and password must not be empty: %w", host, errdefs.ErrInvalidArgument)
	}
	cf, err := c.loadOwn()
	if err != nil {
		return err
	}
	cf.AuthConfigs[authKey(host)] = types.AuthConfig{Username: user, Password: secret, ServerAddress: authKey(host)}
	return c.save(cf)
}

// Erase removes host from hutch's own file; errdefs.ErrNotFound if it had
// no credentials for host.
func (c *Credentials) Erase(host string) error {
	cf, err := c.loadOwn()
	if err != nil {
		return err
	}
	if _, ok := cf.AuthConfigs[authKey(host)]; !ok {
		return fmt.Errorf("not logged in to %s: %w", host, errdefs.ErrNotFound)
	}
	delete(cf.AuthConfigs, authKey(host))
	return c.save(cf)
}

func (c *Credentials) save(cf *configfile.ConfigFile) error {
	if err := os.MkdirAll(filepath.Dir(c.File), 0o700); err != nil {
		return fmt.Errorf("credential file: %w", err)
	}
	f, err := os.CreateTemp(filepath.Dir(c.File), "."+AuthFile+".tmp-")
	if err != nil {
		return fmt.Errorf("credential file: %w", err)
	}
	tmp := f.Name()
	defer os.Remove(tmp)
	err = f.Chmod(0o600)
	if err == nil {
		err = cf.SaveToWriter(f)
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, c.File)
	}
	if err != nil {
		return fmt.Errorf("write credential file %s: %w", c.File, err)
	}
	return nil
}

// ValidHost checks that host is a registry host as a user names it for
// login or --insecure-registry: host[:port], no scheme or path.
func ValidHost(host string) error {
	if host == "" || strings.ContainsAny(host, "/ @\t\n") {
		return fmt.Errorf("registry %q: want HOST or HOST:PORT, without scheme or path: %w", host, errdefs.ErrInvalidArgument)
	}
	return nil
}
