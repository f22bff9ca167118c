package integration

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"reflect"
	"strings"
	"testing"
	"time"

	"hutch.dev/hutch/client"
)

// E2B's volumes through hutch serve: a tenant's volume is mounted by two of
// its sandboxes, which see each other's writes within a second; another
// tenant neither sees, mounts nor removes it (and its volume of the same
// name is another volume); a volume in use is not removed; nothing but a
// tenant's named volumes can be mounted.
func TestServeVolumes(t *testing.T) {
	requiresRoot(t)
	s := newServer(t, "")
	keyA := s.tenantAdd("vol-a")
	keyB := s.tenantAdd("vol-b")
	s.serve()
	a := &client.Client{APIURL: s.url(""), APIKey: keyA}
	b := &client.Client{APIURL: s.url(""), APIKey: keyB}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	status := func(err error) int {
		var e *client.Error
		if errors.As(err, &e) {
			return e.Status
		}
		return 0
	}

	v, err := a.CreateVolume(ctx, "shared")
	if err != nil {
		t.Fatalf("create volume: %v\nserver log:\n%s", err, s.logTail(20))
	}
	if v.ID != "shared" || v.Name != "shared" {
		t.Errorf("created volume %+v, want volumeID and name shared", v)
	}
	if _, err := a.CreateVolume(ctx, "shared"); status(err) != http.StatusConflict {
		t.Errorf("creating shared again: %v, want 409", err)
	}
	if vs, err := a.ListVolumes(ctx); err != nil || !reflect.DeepEqual(vs, []client.Volume{{ID: "shared", Name: "shared"}}) {
		t.Errorf("tenant a's volumes: %+v, %v; want shared only", vs, err)
	}

	mounts := []client.VolumeMount{{Name: "shared", Path: "/data"}}
	var sbs []*client.Sandbox
	for i := 0; i < 2; i++ {
		sb, err := a.Create(ctx, client.CreateRequest{TemplateID: "busybox", Timeout: 600, VolumeMounts: mounts})
		if err != nil {
			t.Fatalf("create sandbox %d with the volume: %v\nserver log:\n%s", i, err, s.logTail(20))
		}
		sbs = append(sbs, sb)
	}
	t.Cleanup(func() {
		for _, sb := range sbs {
			a.Kill(context.Background(), sb.ID)
		}
	})

	t.Run("another tenant does not see, mount or remove it", func(t *testing.T) {
		if vs, err := b.ListVolumes(ctx); err != nil || len(vs) != 0 {
			t.Errorf("tenant b's volumes: %+v, %v; want none", vs, err)
		}
		for _, id := range []string{"shared", "vol-a.shared"} {
			if _, err := b.GetVolume(ctx, id); status(err) != http.StatusNotFound {
				t.Errorf("tenant b GET /volumes/%s: %v, want 404", id, err)
			}
			if err := b.DeleteVolume(ctx, id); status(err) != http.StatusNotFound {
				t.Errorf("tenant b DELETE /volumes/%s: %v, want 404", id, err)
			}
			_, err := b.Create(ctx, client.CreateRequest{TemplateID: "busybox", Timeout: 60, VolumeMounts: []client.VolumeMount{{Name: id, Path: "/data"}}})
			if status(err) != http.StatusNotFound {
				t.Errorf("tenant b mounting %s: %v, want 404", id, err)
			}
		}
		if l, err := b.List(ctx, client.ListOptions{}); err != nil || len(l) != 0 {
			t.Errorf("tenant b's sandboxes after its refused creates: %+v, %v; want none", l, err)
		}
		if _, err := a.GetVolume(ctx, "shared"); err != nil {
			t.Errorf("tenant a's volume after b's attempts: %v", err)
		}
	})

	t.Run("two sandboxes see each other's writes within a second", func(t *testing.T) {
		seen := func(sb *client.Sandbox, file, want string) {
			t.Helper()
			deadline := time.Now().Add(time.Second)
			for {
				out, code, err := shRun(ctx, sb, "cat /data/"+file)
				if err == nil && code == 0 && out == want {
					return
				}
				if time.Now().After(deadline) {
					t.Errorf("sandbox %s reads /data/%s as %q (exit %d, %v), want %q within a second", sb.ID, file, out, code, err, want)
					return
				}
				time.Sleep(50 * time.Millisecond)
			}
		}
		if out, code, err := shRun(ctx, sbs[0], "echo from-first > /data/one"); err != nil || code != 0 {
			t.Fatalf("write in the first sandbox: %q, exit %d, %v", out, code, err)
		}
		seen(sbs[1], "one", "from-first\n")
		if out, code, err := shRun(ctx, sbs[1], "echo from-second > /data/one; echo two > /data/two"); err != nil || code != 0 {
			t.Fatalf("write in the second sandbox: %q, exit %d, %v", out, code, err)
		}
		seen(sbs[0], "one", "from-second\n")
		seen(sbs[0], "two", "two\n")
	})

	t.Run("another tenant's volume of the same name is another volume", func(t *testing.T) {
		if _, err := b.CreateVolume(ctx, "shared"); err != nil {
			t.Fatalf("tenant b creating its own shared: %v", err)
		}
		sb, err := b.Create(ctx, client.CreateRequest{TemplateID: "busybox", Timeout: 60, VolumeMounts: mounts})
		if err != nil {
			t.Fatalf("tenant b mounting its own shared: %v", err)
		}
		out, _, err := shRun(ctx, sb, "ls -A /data; echo b > /data/b-was-here")
		if err != nil || out != "" {
			t.Errorf("tenant b's shared holds %q (%v), want nothing", out, err)
		}
		if out, code, _ := shRun(ctx, sbs[0], "test -e /data/b-was-here"); code == 0 {
			t.Errorf("tenant b's write appeared in tenant a's volume (%q)", out)
		}
		if err := b.Kill(ctx, sb.ID); err != nil {
			t.Error(err)
		}
		if err := b.DeleteVolume(ctx, "shared"); err != nil {
			t.Errorf("tenant b deleting its shared: %v", err)
		}
		if _, err := a.GetVolume(ctx, "shared"); err != nil {
			t.Errorf("tenant a's shared after b deleted its own: %v", err)
		}
	})

	t.Run("the sandbox's detail names its volume mounts", func(t *testing.T) {
		in, err := a.Get(ctx, sbs[0].ID)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(in.VolumeMounts, mounts) {
			t.Errorf("volumeMounts %+v, want %+v", in.VolumeMounts, mounts)
		}
	})

	t.Run("bad mounts are refused and leave nothing", func(t *testing.T) {
		for _, c := range []struct {
			name  string
			vm    client.VolumeMount
			want  int
			words string
		}{
			{"a host path", client.VolumeMount{Name: "/etc", Path: "/data"}, http.StatusBadRequest, "volume name"},
			{"a relative name", client.VolumeMount{Name: "../shared", Path: "/data"}, http.StatusBadRequest, "volume name"},
			{"a missing volume", client.VolumeMount{Name: "nosuch", Path: "/data"}, http.StatusNotFound, `"nosuch" not found`},
			{"a reserved target", client.VolumeMount{Name: "shared", Path: "/proc"}, http.StatusBadRequest, "/proc"},
			{"a relative target", client.VolumeMount{Name: "shared", Path: "data"}, http.StatusBadRequest, "data"},
		} {
			_, err := a.Create(ctx, client.CreateRequest{TemplateID: "busybox", Timeout: 60, VolumeMounts: []client.VolumeMount{c.vm}})
			var e *client.Error
			if !errors.As(err, &e) || e.Status != c.want || !strings.Contains(e.Message, c.words) {
				t.Errorf("%s: %v, want %d naming %q", c.name, err, c.want, c.words)
			}
		}
		if l, err := a.List(ctx, client.ListOptions{}); err != nil || len(l) != 2 {
			t.Errorf("tenant a's sandboxes after refused creates: %d, %v; want 2", len(l), err)
		}
		if _, err := a.CreateVolume(ctx, "bad/name"); status(err) != http.StatusBadRequest {
			t.Errorf("creating volume bad/name: %v, want 400", err)
		}
	})

	t.Run("a volume in use is not removed, then is", func(t *testing.T) {
		err := a.DeleteVolume(ctx, "shared")
		var e *client.Error
		if !errors.As(err, &e) || e.Status != http.StatusConflict || !strings.Contains(e.Message, sbs[0].ID) || !strings.Contains(e.Message, sbs[1].ID) {
			t.Fatalf("DELETE a volume two sandboxes mount: %v, want 409 naming both", err)
		}
		if out, code, err := shRun(ctx, sbs[0], "cat /data/two"); err != nil || code != 0 || out != "two\n" {
			t.Errorf("the volume's file after the refused delete: %q, exit %d, %v", out, code, err)
		}
		for _, sb := range sbs {
			if err := a.Kill(ctx, sb.ID); err != nil {
				t.Fatal(err)
			}
		}
		sbs = nil
		if err := a.DeleteVolume(ctx, "shared"); err != nil {
			t.Fatalf("DELETE the volume no sandbox mounts: %v", err)
		}
		if _, err := a.GetVolume(ctx, "shared"); status(err) != http.StatusNotFound {
			t.Errorf("GET the deleted volume: %v, want 404", err)
		}
		if vs, err := s.volumeNames(); err != nil || len(vs) != 0 {
			t.Errorf("hutch volume ls after the deletes: %v, %v; want none", vs, err)
		}
	})
	s.stopAndCheckClean()
}

// The same through the E2B JavaScript SDK (integration/e2b/volumes.mjs):
// Volume.create, list, getInfo and destroy, and Sandbox.create's
// volumeMounts, for one tenant and against another.
func TestServeVolumesSDK(t *testing.T) {
	requiresRoot(t)
	requireSDK(t)
	s := newServer(t, "")
	keyA := s.tenantAdd("sdk-vol-a")
	keyB := s.tenantAdd("sdk-vol-b")
	s.serve()
	s.runScript(t, "volumes.mjs", keyA, map[string]string{"TENANT_B_KEY": keyB}, 3*time.Minute)
	if vs, err := s.volumeNames(); err != nil || len(vs) != 0 {
		t.Errorf("volumes left after the script: %v, %v", vs, err)
	}
	s.stopAndCheckClean()
}

// A tenant's volumes count toward its disk quota: with a volume holding
// more than what its quota leaves, a create is refused; once the volume is
// deleted, the same create is admitted.
func TestServeVolumeQuota(t *testing.T) {
	requiresRoot(t)
	s := newServer(t, "")
	// Room for one sandbox of the default disk (10 GiB) and 64 MiB more.
	key := s.tenantAdd("vol-q", "--max-disk", "10304m")
	s.serve()
	c := &client.Client{APIURL: s.url(""), APIKey: key}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if _, err := c.CreateVolume(ctx, "big"); err != nil {
		t.Fatal(err)
	}
	sb, err := c.Create(ctx, client.CreateRequest{TemplateID: "busybox", Timeout: 600, VolumeMounts: []client.VolumeMount{{Name: "big", Path: "/big"}}})
	if err != nil {
		t.Fatalf("create within the quota: %v\nserver log:\n%s", err, s.logTail(20))
	}
	if out, code, err := shRun(ctx, sb, "dd if=/dev/zero of=/big/fill bs=1M count=128 2>&1 && sync"); err != nil || code != 0 {
		t.Fatalf("filling the volume: %q, exit %d, %v", out, code, err)
	}
	if err := c.Kill(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	_, err = c.Create(ctx, client.CreateRequest{TemplateID: "busybox", Timeout: 600})
	var e *client.Error
	if !errors.As(err, &e) || e.Status != http.StatusTooManyRequests || !strings.Contains(e.Message, "disk") {
		t.Errorf("create with 128 MiB in the tenant's volume and 64 MiB of quota left: %v, want 429 about disk", err)
	}
	if err := c.DeleteVolume(ctx, "big"); err != nil {
		t.Fatal(err)
	}
	sb, err = c.Create(ctx, client.CreateRequest{TemplateID: "busybox", Timeout: 600})
	if err != nil {
		t.Fatalf("create once the volume is deleted: %v", err)
	}
	if err := c.Kill(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	s.stopAndCheckClean()
}

// volumeNames are the names `hutch volume ls` prints for the server's root.
func (s *server) volumeNames() ([]string, error) {
	r := s.run(nil, "volume", "ls", "--format", "json")
	if r.code != 0 {
		return nil, errors.New(r.String())
	}
	var vs []struct {
		Name string `json:"name"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &vs); err != nil {
		return nil, err
	}
	var names []string
	for _, v := range vs {
		names = append(names, v.Name)
	}
	return names, nil
}

// E2B's volume content API through the SDK (integration/e2b/volcontent.mjs):
// a volume's files without a sandbox, a sandbox's planted links leading
// nowhere out of the volume, and tokens opening their own tenant's volume
// only.
func TestServeVolumeContentSDK(t *testing.T) {
	requiresRoot(t)
	requireSDK(t)
	s := newServer(t, baseArchive(t))
	keyA := s.tenantAdd("vc-a")
	keyB := s.tenantAdd("vc-b")
	s.serve()
	s.runScript(t, "volcontent.mjs", keyA, map[string]string{"TENANT_B_KEY": keyB, "E2B_VOLUME_API_URL": s.url("")}, 4*time.Minute)
	if vs, err := s.volumeNames(); err != nil || len(vs) != 0 {
		t.Errorf("volumes left after the script: %v, %v", vs, err)
	}
	s.stopAndCheckClean()
}
