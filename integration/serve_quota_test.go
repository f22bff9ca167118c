package integration

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"hutch.dev/hutch/client"
)

// A tenant's quota holds on every call that starts a sandbox, not only on
// create: with room for one running sandbox, a paused one is not woken by
// connect, resume, a snapshot, its data plane or a port preview while
// another runs. Each refusal is 429 in E2B's error shape and starts
// nothing: the sandbox stays paused in the engine, with no gVisor sandbox
// process. A port preview without any key wakes a paused sandbox only if
// its create asked for autoResume, and only within the quota; without it
// the preview answers as for a sandbox that is not there.
func TestServeQuotaOnResume(t *testing.T) {
	requiresRoot(t)
	s := newServer(t, "")
	key := s.tenantAdd("one-running", "--max-sandboxes", "1")
	s.serve()
	jsonKey := map[string]string{"X-API-KEY": key, "Content-Type": "application/json"}

	create := func(body string) createdSandbox {
		t.Helper()
		r := s.do("POST", "/sandboxes", strings.NewReader(body), jsonKey)
		if r.status != http.StatusCreated {
			t.Fatalf("POST /sandboxes %s: %s\nserver log:\n%s", body, r, s.logTail(20))
		}
		var c createdSandbox
		if err := json.Unmarshal([]byte(r.body), &c); err != nil || c.SandboxID == "" {
			t.Fatalf("POST /sandboxes answer: %v: %s", err, r)
		}
		return c
	}
	pause := func(id string) {
		t.Helper()
		if r := s.do("POST", "/sandboxes/"+id+"/pause", nil, jsonKey); r.status != http.StatusNoContent {
			t.Fatalf("pause %s: %s", id, r)
		}
	}
	// wantPaused checks the engine's record and the host's processes,
	// not the API's word.
	wantPaused := func(t *testing.T, id, after string) {
		t.Helper()
		if st := s.inspect(id).State; st != "paused" {
			t.Errorf("after %s: sandbox is %s in the engine, want paused", after, st)
		}
		for _, p := range processesMentioning(id) {
			if strings.Contains(p, "runsc-sandbox") {
				t.Errorf("after %s: a gVisor sandbox runs for it: %s", after, p)
			}
		}
	}
	want429 := func(t *testing.T, what string, r apiResponse) {
		t.Helper()
		if r.status != http.StatusTooManyRequests {
			t.Fatalf("%s: %s, want 429", what, r)
		}
		code, msg, err := r.errorBody()
		if err != nil || code != http.StatusTooManyRequests || !strings.Contains(msg, "max-sandboxes") {
			t.Fatalf("%s: body %q: want {code: 429, message: naming max-sandboxes} (%v)", what, r.body, err)
		}
	}

	a := create(`{"templateID":"busybox","timeout":600,"autoPause":true,"autoResume":{"enabled":true}}`)
	pause(a.SandboxID)
	b := create(`{"templateID":"busybox","timeout":600}`)

	t.Run("with another sandbox running, nothing wakes the paused one", func(t *testing.T) {
		for _, c := range []struct {
			what   string
			method string
			path   string
			body   string
			header map[string]string
		}{
			{"connect", "POST", "/sandboxes/" + a.SandboxID + "/connect", `{"timeout":60}`, jsonKey},
			{"connect (v2)", "POST", "/v2/sandboxes/" + a.SandboxID + "/connect", `{"timeout":60}`, jsonKey},
			{"resume", "POST", "/sandboxes/" + a.SandboxID + "/resume", `{"timeout":60}`, jsonKey},
			{"snapshot", "POST", "/sandboxes/" + a.SandboxID + "/snapshots", `{"name":"while-paused"}`, jsonKey},
			{"a port preview with no key", "GET", "/", "", map[string]string{"Host": "8080-" + a.SandboxID + "." + serveDomain}},
			{"a files download with the sandbox's token", "GET", "/files?path=/etc/hostname", "", envdHeaders("", a)},
		} {
			r := s.do(c.method, c.path, strings.NewReader(c.body), c.header)
			want429(t, c.what, r)
			wantPaused(t, a.SandboxID, c.what)
		}
		// The data plane's Connect calls answer Connect's code.
		h := envdHeaders("", a)
		h["Content-Type"] = "application/json"
		r := s.do("POST", "/process.Process/List", strings.NewReader(`{}`), h)
		var ce struct {
			Code    string `json:"code"`
			Message string `json:"message"`
		}
		if r.status != http.StatusTooManyRequests || json.Unmarshal([]byte(r.body), &ce) != nil || ce.Code != "resource_exhausted" || !strings.Contains(ce.Message, "max-sandboxes") {
			t.Errorf("process.Process/List on the paused sandbox: %s, want 429 {code: resource_exhausted, message: naming max-sandboxes}", r)
		}
		wantPaused(t, a.SandboxID, "process.Process/List")
		if got := s.do("GET", "/sandboxes/"+a.SandboxID, nil, jsonKey); !strings.Contains(got.body, `"state":"paused"`) {
			t.Errorf("GET /sandboxes/{id}: %s, want state paused", got)
		}
		if out := s.ok("image", "ls"); strings.Contains(out, "while-paused") {
			t.Errorf("a refused snapshot left an image:\n%s", out)
		}
	})

	if r := s.do("DELETE", "/sandboxes/"+b.SandboxID, nil, jsonKey); r.status != http.StatusNoContent {
		t.Fatalf("DELETE B: %s", r)
	}
	c := create(`{"templateID":"busybox","timeout":600}`)
	pause(c.SandboxID)

	t.Run("a request with no key wakes only a sandbox whose autoResume is on, within the quota", func(t *testing.T) {
		// Nothing runs: the quota would allow it, autoResume does not.
		r := s.do("GET", "/", nil, map[string]string{"Host": "8080-" + c.SandboxID + "." + serveDomain})
		if code, msg, err := r.errorBody(); r.status != http.StatusBadGateway || err != nil || code != http.StatusBadGateway || msg != "The sandbox was not found" {
			t.Errorf("a port preview with no key of a sandbox without autoResume: %s, want E2B's 502 of a sandbox that is not there", r)
		}
		wantPaused(t, c.SandboxID, "a port preview with no key")
		var info struct {
			Lifecycle struct {
				AutoResume bool `json:"autoResume"`
			} `json:"lifecycle"`
		}
		for id, want := range map[string]bool{a.SandboxID: true, c.SandboxID: false} {
			r := s.do("GET", "/sandboxes/"+id, nil, jsonKey)
			if json.Unmarshal([]byte(r.body), &info) != nil || info.Lifecycle.AutoResume != want {
				t.Errorf("GET /sandboxes/%s: %s, want lifecycle.autoResume %v", id, r, want)
			}
		}

		// A has autoResume: the same request wakes it (nothing listens on
		// the port, so the answer is the proxy's).
		s.do("GET", "/", nil, map[string]string{"Host": "8080-" + a.SandboxID + "." + serveDomain})
		if st := s.inspect(a.SandboxID).State; st != "running" {
			t.Fatalf("a port preview with no key of a sandbox with autoResume: it is %s, want running", st)
		}
		// Now A runs, and C's owner cannot wake it either.
		want429(t, "connect of C with A running", s.do("POST", "/sandboxes/"+c.SandboxID+"/connect", strings.NewReader(`{"timeout":60}`), jsonKey))
		wantPaused(t, c.SandboxID, "connect of C with A running")
	})

	s.deleteAllThroughAPI(key)
	s.stopAndCheckClean()
}

// Snapshots count against max-snapshots and, with the disk their files
// take, against max-disk, on top of the tenant's sandboxes: a tenant at
// its snapshot limit gets 429 on the next snapshot, and one whose
// snapshot fills its disk quota cannot fork until it deletes it.
func TestServeSnapshotQuota(t *testing.T) {
	requiresRoot(t)
	s := newServer(t, "")
	// Room for two sandboxes of the default disk (10 GiB) and 64 MiB
	// more, and one snapshot.
	key := s.tenantAdd("snap-q", "--max-disk", "20544m", "--max-snapshots", "1")
	s.serve()
	c := &client.Client{APIURL: s.url(""), APIKey: key}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()

	sb, err := c.Create(ctx, client.CreateRequest{TemplateID: "busybox", Timeout: 600})
	if err != nil {
		t.Fatalf("create: %v\nserver log:\n%s", err, s.logTail(20))
	}
	if out, code, err := shRun(ctx, sb, "dd if=/dev/urandom of=/root/fill bs=1M count=128 2>&1 && sync"); err != nil || code != 0 {
		t.Fatalf("writing 128 MiB: %q, exit %d, %v", out, code, err)
	}
	snap, err := c.Snapshot(ctx, sb.ID, "kept")
	if err != nil {
		t.Fatalf("the first snapshot: %v\nserver log:\n%s", err, s.logTail(20))
	}
	images := func() string { return s.ok("image", "ls") }

	var e *client.Error
	_, err = c.Snapshot(ctx, sb.ID, "one-too-many")
	if !errors.As(err, &e) || e.Status != http.StatusTooManyRequests || !strings.Contains(e.Message, "max-snapshots") {
		t.Errorf("a snapshot past max-snapshots 1: %v, want 429 naming max-snapshots", err)
	}
	if out := images(); strings.Contains(out, "one-too-many") {
		t.Errorf("the refused snapshot left an image:\n%s", out)
	}

	// 10 GiB running + 128 MiB of snapshot + 10 GiB asked > 20 GiB 64 MiB.
	_, err = c.Fork(ctx, sb.ID, 1, 10*time.Minute)
	if !errors.As(err, &e) || e.Status != http.StatusTooManyRequests || !strings.Contains(e.Message, "max-disk") {
		t.Errorf("a fork with the snapshot's disk taking the quota's room: %v, want 429 naming max-disk", err)
	}
	if ls := s.list(); len(ls) != 1 {
		t.Errorf("after the refused fork the engine has %d sandboxes, want 1: %+v", len(ls), ls)
	}

	// Once the snapshot is gone, the same fork fits.
	if r := s.do("DELETE", "/templates/"+snap, nil, map[string]string{"X-API-KEY": key}); r.status != http.StatusNoContent {
		t.Fatalf("DELETE /templates/%s: %s", snap, r)
	}
	kids, err := c.Fork(ctx, sb.ID, 1, 10*time.Minute)
	if err != nil || len(kids) != 1 {
		t.Fatalf("the fork once the snapshot is deleted: %v, %v\nserver log:\n%s", kids, err, s.logTail(20))
	}
	s.deleteAllThroughAPI(key)
	s.stopAndCheckClean()
}
