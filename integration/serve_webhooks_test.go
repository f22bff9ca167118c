package integration

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// webhookReceiver is an HTTP server on a test host that checks each
// delivery's e2b-signature and keeps the events, answering 500 to the
// first delivery of all (so that one is retried).
type webhookReceiver struct {
	secret string
	mu     sync.Mutex
	events []map[string]any
	bad    []string
	first  bool
}

func (rc *webhookReceiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	sum := sha256.Sum256(append([]byte(rc.secret), body...))
	rc.mu.Lock()
	defer rc.mu.Unlock()
	if got, want := r.Header.Get("e2b-signature"), base64.RawURLEncoding.EncodeToString(sum[:]); got != want {
		rc.bad = append(rc.bad, "signature "+got+", want "+want)
		w.WriteHeader(http.StatusUnauthorized)
		return
	}
	if !rc.first {
		rc.first = true
		w.WriteHeader(http.StatusInternalServerError)
		return
	}
	var e map[string]any
	if err := json.Unmarshal(body, &e); err != nil {
		rc.bad = append(rc.bad, "body "+string(body))
	}
	rc.events = append(rc.events, e)
	w.WriteHeader(http.StatusOK)
}

// typesOf is the event types the receiver got for sandbox id, in order.
func (rc *webhookReceiver) typesOf(id string) []string {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	var out []string
	for _, e := range rc.events {
		if e["sandboxId"] == id {
			out = append(out, strings.TrimPrefix(e["type"].(string), "sandbox.lifecycle."))
		}
	}
	return out
}

// A tenant's webhook on an allowed test host gets signed events of a
// sandbox's whole life, in order, the first retried after a failure, and
// of an expired sandbox; a destination outside the operator's allow
// list cannot be registered; another tenant sees and changes none.
func TestServeWebhooks(t *testing.T) {
	requiresRoot(t)
	w := newTestWorld(t)
	rc := &webhookReceiver{secret: "the-receivers-secret"}
	l := w.listenInNetns("tcp", net.JoinHostPort(w.testHost, "8088")).(net.Listener)
	hs := &http.Server{Handler: rc}
	go hs.Serve(l)
	t.Cleanup(func() { hs.Close() })

	s := newServer(t, "")
	s.flags = []string{"--webhook-allow", w.testHost + "/32"}
	key := s.tenantAdd("hooks")
	other := s.tenantAdd("others")
	s.serve()
	call := func(method, path, k, body string) apiResponse {
		t.Helper()
		h := map[string]string{"X-API-KEY": k}
		if body == "" {
			return s.do(method, path, nil, h)
		}
		h["Content-Type"] = "application/json"
		return s.do(method, path, strings.NewReader(body), h)
	}
	url := "http://" + net.JoinHostPort(w.testHost, "8088") + "/hook"
	for _, dest := range []string{"http://" + w.public + ":8088/hook", "http://" + w.other + "/", "ftp://" + w.testHost + "/"} {
		if r := call("POST", "/events/webhooks", key, `{"name":"x","url":"`+dest+`","signatureSecret":"a-long-secret"}`); r.status != http.StatusBadRequest {
			t.Errorf("a webhook to %s, outside the allow list: %s, want 400", dest, r)
		}
	}
	r := call("POST", "/events/webhooks", key, `{"name":"mine","url":"`+url+`","enabled":true,"signatureSecret":"`+rc.secret+`"}`)
	var hook struct {
		ID     string   `json:"id"`
		Events []string `json:"events"`
	}
	if r.status != http.StatusCreated || json.Unmarshal([]byte(r.body), &hook) != nil || strings.Contains(r.body, rc.secret) || len(hook.Events) != 6 {
		t.Fatalf("register the webhook: %s, want 201 with every event and no secret", r)
	}
	if r := call("GET", "/events/webhooks/"+hook.ID, other, ""); r.status != http.StatusNotFound {
		t.Errorf("another tenant reading the webhook: %s, want 404", r)
	}
	if r := call("PATCH", "/events/webhooks/"+hook.ID, other, `{"enabled":false}`); r.status != http.StatusNotFound {
		t.Errorf("another tenant changing the webhook: %s, want 404", r)
	}
	if r := call("PATCH", "/events/webhooks/"+hook.ID, key, `{"url":"http://`+w.public+`/"}`); r.status != http.StatusBadRequest {
		t.Errorf("moving the webhook outside the allow list: %s, want 400", r)
	}

	// A life: created, updated, paused, resumed, checkpointed, killed.
	sb := s.createSandbox(key, "busybox")
	for _, c := range [][2]string{
		{"POST", "/sandboxes/" + sb.SandboxID + "/timeout"},
		{"POST", "/sandboxes/" + sb.SandboxID + "/pause"},
		{"POST", "/sandboxes/" + sb.SandboxID + "/connect"},
		{"POST", "/sandboxes/" + sb.SandboxID + "/snapshots"},
		{"DELETE", "/sandboxes/" + sb.SandboxID},
	} {
		body := `{"timeout":300}`
		if strings.HasSuffix(c[1], "/pause") || strings.HasSuffix(c[1], "/snapshots") || c[0] == "DELETE" {
			body = ""
		}
		if r := call(c[0], c[1], key, body); r.status >= 300 {
			t.Fatalf("%s %s: %s", c[0], c[1], r)
		}
	}
	// One that expires: its end is found without a call.
	r = s.do("POST", "/sandboxes", strings.NewReader(`{"templateID":"busybox","timeout":3}`), map[string]string{"X-API-KEY": key, "Content-Type": "application/json"})
	var short createdSandbox
	if r.status != http.StatusCreated || json.Unmarshal([]byte(r.body), &short) != nil {
		t.Fatalf("create: %s", r)
	}
	want := map[string][]string{
		sb.SandboxID:    {"created", "updated", "paused", "resumed", "checkpointed", "killed"},
		short.SandboxID: {"created", "killed"},
	}
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		done := true
		for id, ws := range want {
			done = done && strings.Join(rc.typesOf(id), " ") == strings.Join(ws, " ")
		}
		if done {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("events in 60 s: %v and %v; want %v and %v\nserver log:\n%s", rc.typesOf(sb.SandboxID), rc.typesOf(short.SandboxID), want[sb.SandboxID], want[short.SandboxID], s.logTail(20))
		}
	}
	rc.mu.Lock()
	if len(rc.bad) > 0 {
		t.Errorf("bad deliveries: %v", rc.bad)
	}
	e := rc.events[0]
	rc.mu.Unlock()
	if e["version"] != "v1" || e["sandboxTeamId"] != "hooks" || e["sandboxTemplateId"] != "busybox" || e["timestamp"] == nil {
		t.Errorf("an event: %v, want E2B's payload for tenant hooks and template busybox", e)
	}
	if r := call("DELETE", "/events/webhooks/"+hook.ID, key, ""); r.status != http.StatusOK {
		t.Errorf("delete the webhook: %s", r)
	}
	s.deleteAllThroughAPI(key, other)
	s.stopAndCheckClean()
}

// A tenant's usage over time (E2B's team metrics): the sandboxes it ran
// at once and how fast it started them, for its own team only.
func TestServeTeamMetrics(t *testing.T) {
	requiresRoot(t)
	s := newServer(t, "")
	key := s.tenantAdd("usage")
	other := s.tenantAdd("usage-other")
	s.serve()
	get := func(path string) apiResponse {
		t.Helper()
		return s.do("GET", path, nil, map[string]string{"X-API-KEY": key})
	}
	before := time.Now().Unix()
	a := s.createSandbox(key, "busybox")
	b := s.createSandbox(key, "busybox")
	theirs := s.createSandbox(other, "busybox")
	var many struct {
		Sandboxes map[string]struct {
			MemTotal int64 `json:"memTotal"`
		} `json:"sandboxes"`
	}
	if r := get("/sandboxes/metrics?sandbox_ids=" + a.SandboxID + "," + b.SandboxID + "," + theirs.SandboxID); r.status != http.StatusOK || json.Unmarshal([]byte(r.body), &many) != nil || len(many.Sandboxes) != 2 || many.Sandboxes[a.SandboxID].MemTotal == 0 {
		t.Errorf("GET /sandboxes/metrics of two own sandboxes and another tenant's: %s, want the two own with their samples", r)
	}
	if r := get("/sandboxes/metrics"); r.status != http.StatusBadRequest {
		t.Errorf("GET /sandboxes/metrics without IDs: %s, want 400", r)
	}
	type sample struct {
		At         int64   `json:"timestampUnix"`
		Concurrent int     `json:"concurrentSandboxes"`
		StartRate  float64 `json:"sandboxStartRate"`
	}
	var smps []sample
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(500 * time.Millisecond) {
		r := get("/teams/usage/metrics?start=" + strconv.FormatInt(before, 10))
		smps = nil
		if r.status != http.StatusOK || json.Unmarshal([]byte(r.body), &smps) != nil {
			t.Fatalf("team metrics: %s", r)
		}
		if len(smps) > 0 && smps[len(smps)-1].Concurrent == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no sample with 2 sandboxes in 20 s: %+v", smps)
		}
	}
	started := false
	for _, smp := range smps {
		started = started || smp.StartRate > 0
		if smp.At < before {
			t.Errorf("a sample of %d, before the window's start %d", smp.At, before)
		}
	}
	if !started {
		t.Errorf("no sample counts the two starts: %+v", smps)
	}
	var max struct {
		Value float64 `json:"value"`
	}
	if r := get("/teams/usage/metrics/max?metric=concurrent_sandboxes"); r.status != http.StatusOK || json.Unmarshal([]byte(r.body), &max) != nil || max.Value != 2 {
		t.Errorf("max concurrent sandboxes: %s, want 2", r)
	}
	for path, want := range map[string]int{
		"/teams/someone-else/metrics":          http.StatusForbidden,
		"/teams/usage/metrics/max?metric=cpu":  http.StatusBadRequest,
		"/teams/usage/metrics?start=10&end=5":  http.StatusBadRequest,
		"/teams/usage/metrics?start=yesterday": http.StatusBadRequest,
	} {
		if r := get(path); r.status != want {
			t.Errorf("GET %s: %s, want %d", path, r, want)
		}
	}
	s.deleteAllThroughAPI(key, other)
	s.stopAndCheckClean()
}
