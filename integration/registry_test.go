package integration

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/distribution/distribution/v3/configuration"
	_ "github.com/distribution/distribution/v3/registry/auth/htpasswd"
	"github.com/distribution/distribution/v3/registry/handlers"
	_ "github.com/distribution/distribution/v3/registry/storage/driver/inmemory"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/sirupsen/logrus"
	"golang.org/x/crypto/bcrypt"
)

// testRegistry is a distribution registry served on loopback by the test.
type testRegistry struct {
	app  http.Handler
	srv  *httptest.Server
	host string // 127.0.0.1:PORT
}

// startRegistry serves an in-memory registry on 127.0.0.1; with users, it
// asks for basic auth against an htpasswd file of them.
func startRegistry(t *testing.T, users map[string]string) *testRegistry {
	t.Helper()
	logrus.SetLevel(logrus.ErrorLevel)
	cfg := &configuration.Configuration{
		Storage: configuration.Storage{"inmemory": configuration.Parameters{}},
	}
	cfg.HTTP.Secret = "hutch-test-secret"
	cfg.Log.AccessLog.Disabled = true
	cfg.Log.Level = "error"
	if len(users) > 0 {
		var lines []string
		for u, p := range users {
			h, err := bcrypt.GenerateFromPassword([]byte(p), bcrypt.MinCost)
			if err != nil {
				t.Fatal(err)
			}
			lines = append(lines, u+":"+string(h))
		}
		f := filepath.Join(t.TempDir(), "htpasswd")
		if err := os.WriteFile(f, []byte(strings.Join(lines, "\n")+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		cfg.Auth = configuration.Auth{"htpasswd": configuration.Parameters{"realm": "hutch-test", "path": f}}
	}
	r := &testRegistry{app: handlers.NewApp(context.Background(), cfg)}
	r.srv = httptest.NewServer(r.app)
	t.Cleanup(r.srv.Close)
	r.host = strings.TrimPrefix(r.srv.URL, "http://")
	return r
}

// front serves the registry's API through h on another loopback port, as
// a misbehaving registry or a proxy in front of it would; it returns the
// front's host.
func (r *testRegistry) front(t *testing.T, h func(w http.ResponseWriter, req *http.Request, next http.Handler)) string {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) { h(w, req, r.app) }))
	t.Cleanup(srv.Close)
	return strings.TrimPrefix(srv.URL, "http://")
}

// storedImage is the part of `hutch image ls --format json` the tests read.
type storedImage struct {
	Name   string
	Digest string
	Source string
	Config struct {
		Architecture string `json:"architecture"`
		OS           string `json:"os"`
	}
	Layers []struct {
		Digest string `json:"digest"`
		Size   int64  `json:"size"`
	}
}

func (e *env) storedImages() []storedImage {
	e.t.Helper()
	var imgs []storedImage
	if err := json.Unmarshal([]byte(e.ok("image", "ls", "--format", "json")), &imgs); err != nil {
		e.t.Fatal(err)
	}
	return imgs
}

// assertNothingPulled checks that a failed pull named no image and left
// no half-written blob in the store's ingest area.
func (e *env) assertNothingPulled() {
	e.t.Helper()
	if imgs := e.storedImages(); len(imgs) != 0 {
		e.t.Fatalf("a failed pull left images: %+v", imgs)
	}
	ingest, _ := filepath.Glob(filepath.Join(e.root, "images", "oci", "ingest", "*"))
	if len(ingest) != 0 {
		e.t.Fatalf("a failed pull left partial blobs: %v", ingest)
	}
}

// pushBusybox pushes the test image to ref through a fresh hutch and returns
// the manifest digest hutch printed.
func pushBusybox(t *testing.T, insecure, ref string, login ...string) string {
	t.Helper()
	e := newRegEnv(t)
	if len(login) == 2 {
		r := e.run(strings.NewReader(login[1]), "login", "--insecure-registry", insecure, "-u", login[0], "--password-stdin", insecure)
		if r.code != 0 {
			t.Fatalf("login: %s", r)
		}
	}
	return strings.TrimSpace(e.ok("image", "push", "--insecure-registry", insecure, "busybox", ref))
}

func TestRegistryPushPullRun(t *testing.T) {
	reg := startRegistry(t, nil)
	ref := reg.host + "/test/busybox:1"
	dgst := pushBusybox(t, reg.host, ref)
	if !strings.HasPrefix(dgst, "sha256:") {
		t.Fatalf("push printed %q, want the manifest digest", dgst)
	}

	t.Run("by tag", func(t *testing.T) {
		e := newRegEnv(t)
		if out := strings.TrimSpace(e.ok("image", "pull", "--insecure-registry", reg.host, ref)); out != ref {
			t.Fatalf("pull printed %q, want %q", out, ref)
		}
		imgs := e.storedImages()
		if len(imgs) != 1 || imgs[0].Name != ref || imgs[0].Digest != dgst || imgs[0].Source != ref {
			t.Fatalf("after pull, images = %+v; want %s at %s from %s", imgs, ref, dgst, ref)
		}
		if out := e.ok("run", "--rm", "--pull", "never", "--image", ref, "--", "echo", "hi"); out != "hi\n" {
			t.Fatalf("run printed %q", out)
		}
	})

	t.Run("by digest", func(t *testing.T) {
		e := newRegEnv(t)
		byDigest := reg.host + "/test/busybox@" + dgst
		e.ok("image", "pull", "--insecure-registry", reg.host, byDigest)
		if out := e.ok("run", "--rm", "--pull", "never", "--image", byDigest, "--", "echo", "hi"); out != "hi\n" {
			t.Fatalf("run printed %q", out)
		}
	})

	t.Run("run pulls what is missing", func(t *testing.T) {
		e := newRegEnv(t)
		r := e.run(nil, "run", "--rm", "--pull", "never", "--image", ref, "--", "echo", "hi")
		assertOneLineError(t, r, "not found")
		if out := e.ok("run", "--rm", "--pull", "missing", "--insecure-registry", reg.host, "--image", ref, "--", "echo", "hi"); out != "hi\n" {
			t.Fatalf("run printed %q", out)
		}
	})

	t.Run("plain HTTP needs --insecure-registry", func(t *testing.T) {
		e := newRegEnv(t)
		assertOneLineError(t, e.run(nil, "image", "pull", ref), "--insecure-registry "+reg.host)
		e.assertNothingPulled()
	})

	t.Run("rootless", func(t *testing.T) {
		e := newRootlessEnv(t)
		e.ok("image", "pull", "--insecure-registry", reg.host, ref)
		if out := e.ok("run", "--rm", "--pull", "never", "--image", ref, "--", "id", "-u"); out != "0\n" {
			t.Fatalf("run printed %q", out)
		}
	})

	t.Run("build FROM a pulled image", func(t *testing.T) {
		e := newRegEnv(t)
		t.Cleanup(e.stopBuilder)
		e.ok("image", "pull", "--insecure-registry", reg.host, ref)
		dir := t.TempDir()
		df := "FROM " + ref + "\nRUN echo built > /built\n"
		if err := os.WriteFile(filepath.Join(dir, "Dockerfile"), []byte(df), 0o644); err != nil {
			t.Fatal(err)
		}
		t.Log(e.ok("image", "build", "--progress", "plain", "-t", "child", dir))
		if out := e.ok("run", "--rm", "--image", "child", "--", "cat", "/built"); out != "built\n" {
			t.Fatalf("run printed %q", out)
		}
	})
}

func TestRegistryMultiArch(t *testing.T) {
	reg := startRegistry(t, nil)
	idx := v1.ImageIndex(empty.Index)
	want := map[string]v1.Hash{}
	for _, arch := range []string{"arm64", "amd64"} {
		img, err := random.Image(512, 1)
		if err != nil {
			t.Fatal(err)
		}
		cf, err := img.ConfigFile()
		if err != nil {
			t.Fatal(err)
		}
		cf = cf.DeepCopy()
		cf.OS, cf.Architecture = "linux", arch
		if img, err = mutate.ConfigFile(img, cf); err != nil {
			t.Fatal(err)
		}
		if want[arch], err = img.Digest(); err != nil {
			t.Fatal(err)
		}
		idx = mutate.AppendManifests(idx, mutate.IndexAddendum{
			Add:        img,
			Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: arch}},
		})
	}
	ref := reg.host + "/test/multi:1"
	tag, err := name.NewTag(ref, name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.WriteIndex(tag, idx); err != nil {
		t.Fatal(err)
	}

	e := newRegEnv(t)
	e.ok("image", "pull", "--insecure-registry", reg.host, ref)
	imgs := e.storedImages()
	if len(imgs) != 1 || imgs[0].Digest != want["amd64"].String() || imgs[0].Config.Architecture != "amd64" {
		t.Fatalf("pulled %+v; want the amd64 manifest %s", imgs, want["amd64"])
	}
}

func TestRegistryCredentials(t *testing.T) {
	reg := startRegistry(t, map[string]string{"alice": "s3cret"})
	ref := reg.host + "/private/busybox:1"
	pushBusybox(t, reg.host, ref, "alice", "s3cret")

	t.Run("wrong password at login", func(t *testing.T) {
		e := newRegEnv(t)
		r := e.run(strings.NewReader("nope\n"), "login", "--insecure-registry", reg.host, "-u", "alice", "--password-stdin", reg.host)
		t.Logf("login with a wrong password: %s", r)
		assertOneLineError(t, r, "refused the credentials")
		if _, err := os.Stat(filepath.Join(e.root, "auth.json")); !os.IsNotExist(err) {
			t.Fatalf("a refused login stored credentials: %v", err)
		}
	})

	t.Run("no credentials", func(t *testing.T) {
		e := newRegEnv(t)
		assertOneLineError(t, e.run(nil, "image", "pull", "--insecure-registry", reg.host, ref), "hutch login "+reg.host)
		e.assertNothingPulled()
	})

	t.Run("login, pull, logout", func(t *testing.T) {
		e := newRegEnv(t)
		if r := e.run(strings.NewReader("s3cret\n"), "login", "--insecure-registry", reg.host, "-u", "alice", "--password-stdin", reg.host); r.code != 0 {
			t.Fatalf("login: %s", r)
		}
		fi, err := os.Stat(filepath.Join(e.root, "auth.json"))
		if err != nil || fi.Mode().Perm() != 0o600 {
			t.Fatalf("credential file: %v, %v; want mode 0600", fi, err)
		}
		e.ok("image", "pull", "--insecure-registry", reg.host, ref)
		e.ok("logout", reg.host)
		e.ok("image", "rm", ref)
		assertOneLineError(t, e.run(nil, "image", "pull", "--insecure-registry", reg.host, ref), "refused the credentials")
	})

	t.Run("docker config", func(t *testing.T) {
		for _, tc := range []struct {
			password string
			ok       bool
		}{{"wrong", false}, {"s3cret", true}} {
			e := newRegEnv(t)
			dir := t.TempDir()
			cfg := `{"auths": {"` + reg.host + `": {"auth": "` + basicAuth("alice", tc.password) + `"}}}`
			if err := os.WriteFile(filepath.Join(dir, "config.json"), []byte(cfg), 0o600); err != nil {
				t.Fatal(err)
			}
			e.extra = append(e.extra, "DOCKER_CONFIG="+dir)
			r := e.run(nil, "image", "pull", "--insecure-registry", reg.host, ref)
			if tc.ok {
				if r.code != 0 {
					t.Fatalf("pull with docker's credentials: %s", r)
				}
				continue
			}
			assertOneLineError(t, r, "refused the credentials")
			e.assertNothingPulled()
		}
	})
}

func basicAuth(user, password string) string {
	return base64.StdEncoding.EncodeToString([]byte(user + ":" + password))
}

// newRegEnv is newEnv with a docker config directory of its own (empty),
// so that the host's docker credentials play no part.
func newRegEnv(t *testing.T) *env {
	e := newEnv(t)
	e.extra = append(e.extra, "DOCKER_CONFIG="+t.TempDir())
	return e
}

// layerOf is the digest of the busybox image's only layer, as ref's
// registry has it.
func layerOf(t *testing.T, reg *testRegistry, ref string) string {
	t.Helper()
	e := newRegEnv(t)
	e.ok("image", "pull", "--insecure-registry", reg.host, ref)
	imgs := e.storedImages()
	if len(imgs) != 1 || len(imgs[0].Layers) == 0 {
		t.Fatalf("images %+v", imgs)
	}
	return imgs[0].Layers[len(imgs[0].Layers)-1].Digest
}

func TestRegistryDiesMidPull(t *testing.T) {
	reg := startRegistry(t, nil)
	pushBusybox(t, reg.host, reg.host+"/test/busybox:1")
	layer := layerOf(t, reg, reg.host+"/test/busybox:1")

	var dead atomic.Bool
	host := reg.front(t, func(w http.ResponseWriter, req *http.Request, next http.Handler) {
		if dead.Load() {
			panic(http.ErrAbortHandler)
		}
		if req.Method != http.MethodGet || !strings.HasSuffix(req.URL.Path, "/blobs/"+layer) {
			next.ServeHTTP(w, req)
			return
		}
		// Send half the layer, slowly, then die for good.
		rec := httptest.NewRecorder()
		next.ServeHTTP(rec, req)
		body := rec.Body.Bytes()
		for k, v := range rec.Header() {
			w.Header()[k] = v
		}
		w.WriteHeader(rec.Code)
		half := body[:len(body)/2]
		for len(half) > 0 {
			n := min(len(half), 4096)
			w.Write(half[:n])
			w.(http.Flusher).Flush()
			half = half[n:]
			time.Sleep(time.Millisecond)
		}
		dead.Store(true)
		panic(http.ErrAbortHandler)
	})
	e := newRegEnv(t)
	r := e.run(nil, "image", "pull", "--insecure-registry", host, host+"/test/busybox:1")
	t.Logf("pull from a dying registry: %s", r)
	if r.code != 125 || !dead.Load() {
		t.Fatalf("pull from a dying registry: %s (died: %v)", r, dead.Load())
	}
	e.assertNothingPulled()
}

func TestRegistryTamperedBlob(t *testing.T) {
	reg := startRegistry(t, nil)
	pushBusybox(t, reg.host, reg.host+"/test/busybox:1")
	layer := layerOf(t, reg, reg.host+"/test/busybox:1")

	var once sync.Once
	served := false
	host := reg.front(t, func(w http.ResponseWriter, req *http.Request, next http.Handler) {
		if req.Method != http.MethodGet || !strings.HasSuffix(req.URL.Path, "/blobs/"+layer) {
			next.ServeHTTP(w, req)
			return
		}
		rec := httptest.NewRecorder()
		next.ServeHTTP(rec, req)
		body := append([]byte(nil), rec.Body.Bytes()...)
		body[len(body)/2] ^= 0xff
		for k, v := range rec.Header() {
			w.Header()[k] = v
		}
		w.WriteHeader(rec.Code)
		w.Write(body)
		once.Do(func() { served = true })
	})
	e := newRegEnv(t)
	r := e.run(nil, "image", "pull", "--insecure-registry", host, host+"/test/busybox:1")
	t.Logf("pull of a tampered layer: %s", r)
	assertOneLineError(t, r, "digest")
	if !served {
		t.Fatal("the tampered layer was never fetched")
	}
	e.assertNothingPulled()
}
