package registry

import (
	"encoding/base64"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/containerd/errdefs"
)

func writeDockerConfig(t *testing.T, body string) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "config.json"), []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return dir
}

func auth(u, p string) string { return base64.StdEncoding.EncodeToString([]byte(u + ":" + p)) }

func TestCredentialsLookup(t *testing.T) {
	docker := writeDockerConfig(t, `{"auths": {
		"https://index.docker.io/v1/": {"auth": "`+auth("hubuser", "hubpass")+`"},
		"ghcr.io": {"auth": "`+auth("gh", "ghpass")+`"},
		"https://legacy.example:5000": {"auth": "`+auth("old", "oldpass")+`"},
		"token.example": {"identitytoken": "tok"},
		"shared.example": {"auth": "`+auth("docker", "dockerpass")+`"}
	}}`)
	c := &Credentials{File: filepath.Join(t.TempDir(), AuthFile), DockerConfigDir: docker}
	if err := c.Store("shared.example", "hutch", "hutchpass"); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(c.File)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("credential file %v, %v: want mode 0600", fi, err)
	}
	for _, tc := range []struct{ host, user, secret string }{
		{"docker.io", "hubuser", "hubpass"},
		{"registry-1.docker.io", "hubuser", "hubpass"},
		{"ghcr.io", "gh", "ghpass"},
		{"legacy.example:5000", "old", "oldpass"},
		{"token.example", "", "tok"},
		{"shared.example", "hutch", "hutchpass"}, // hutch's own store first
		{"unknown.example", "", ""},
	} {
		u, s, err := c.Lookup(tc.host)
		if err != nil || u != tc.user || s != tc.secret {
			t.Errorf("Lookup(%q) = %q, %q, %v; want %q, %q", tc.host, u, s, err, tc.user, tc.secret)
		}
	}

	if err := c.Erase("shared.example"); err != nil {
		t.Fatal(err)
	}
	if u, _, _ := c.Lookup("shared.example"); u != "docker" {
		t.Errorf("after Erase, Lookup = %q; want docker's config's user", u)
	}
	if err := c.Erase("shared.example"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("second Erase: %v, want ErrNotFound", err)
	}
}

func TestCredentialsNoFiles(t *testing.T) {
	c := &Credentials{File: filepath.Join(t.TempDir(), AuthFile), DockerConfigDir: t.TempDir()}
	u, s, err := c.Lookup("ghcr.io")
	if err != nil || u != "" || s != "" {
		t.Fatalf("Lookup with no files = %q, %q, %v; want nothing", u, s, err)
	}
}

func TestCredentialsBadInput(t *testing.T) {
	c := &Credentials{File: filepath.Join(t.TempDir(), AuthFile), DockerConfigDir: "-"}
	for _, tc := range []struct{ host, user, pass string }{
		{"", "u", "p"}, {"https://ghcr.io", "u", "p"}, {"ghcr.io/o", "u", "p"}, {"ghcr.io", "", "p"}, {"ghcr.io", "u", ""},
	} {
		if err := c.Store(tc.host, tc.user, tc.pass); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("Store(%q, %q, %q) = %v; want ErrInvalidArgument", tc.host, tc.user, tc.pass, err)
		}
	}
	if err := os.WriteFile(c.File, []byte("{not json"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, _, err := c.Lookup("ghcr.io"); !errors.Is(err, errdefs.ErrDataLoss) {
		t.Errorf("Lookup with a corrupt file: %v; want ErrDataLoss", err)
	}
}

func TestCredentialHelper(t *testing.T) {
	bin := t.TempDir()
	helper := "#!/bin/sh\nread host\necho '{\"ServerURL\":\"'$host'\",\"Username\":\"helper\",\"Secret\":\"fromhelper\"}'\n"
	if err := os.WriteFile(filepath.Join(bin, "docker-credential-hutchtest"), []byte(helper), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", bin+string(os.PathListSeparator)+os.Getenv("PATH"))
	docker := writeDockerConfig(t, `{"credHelpers": {"private.example": "hutchtest"}}`)
	c := &Credentials{DockerConfigDir: docker}
	u, s, err := c.Lookup("private.example")
	if err != nil || u != "helper" || s != "fromhelper" {
		t.Fatalf("Lookup through a credential helper = %q, %q, %v", u, s, err)
	}
}
