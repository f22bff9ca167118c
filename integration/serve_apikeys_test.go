package integration

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
)

// A tenant makes, lists, renames and revokes its own API keys through
// E2B's /api-keys: a new key opens the API at once, a revoked one is
// refused at once, another tenant sees and revokes none of them, and the
// last key is not revoked.
func TestServeAPIKeys(t *testing.T) {
	requiresRoot(t)
	s := newServer(t, "")
	keyA := s.tenantAdd("keys-a")
	keyB := s.tenantAdd("keys-b")
	s.serve()
	call := func(method, path, key, body string) apiResponse {
		t.Helper()
		h := map[string]string{"X-API-KEY": key}
		var r *strings.Reader
		if body != "" {
			h["Content-Type"] = "application/json"
			r = strings.NewReader(body)
			return s.do(method, path, r, h)
		}
		return s.do(method, path, nil, h)
	}
	type key struct {
		ID   string `json:"id"`
		Name string `json:"name"`
		Key  string `json:"key"`
		Mask struct {
			Prefix string `json:"prefix"`
			Suffix string `json:"maskedValueSuffix"`
		} `json:"mask"`
	}
	list := func(k string) []key {
		t.Helper()
		r := call("GET", "/api-keys", k, "")
		var out []key
		if r.status != http.StatusOK || json.Unmarshal([]byte(r.body), &out) != nil {
			t.Fatalf("GET /api-keys: %s", r)
		}
		return out
	}
	first := list(keyA)
	if len(first) != 1 || first[0].Mask.Prefix != "e2b_" || first[0].Mask.Suffix != keyA[len(keyA)-4:] || strings.Contains(call("GET", "/api-keys", keyA, "").body, keyA) {
		t.Fatalf("tenant A's keys: %+v, want its first key, masked, never in full", first)
	}
	r := call("POST", "/api-keys", keyA, `{"name":"ci"}`)
	var made key
	if r.status != http.StatusCreated || json.Unmarshal([]byte(r.body), &made) != nil || !strings.HasPrefix(made.Key, "e2b_") || made.Name != "ci" {
		t.Fatalf("POST /api-keys: %s", r)
	}
	if r := call("GET", "/sandboxes", made.Key, ""); r.status != http.StatusOK {
		t.Fatalf("the new key: GET /sandboxes %s, want 200", r)
	}
	if r := call("PATCH", "/api-keys/"+made.ID, keyA, `{"name":"ci-renamed"}`); r.status != http.StatusOK {
		t.Fatalf("rename: %s", r)
	}
	if ks := list(made.Key); len(ks) != 2 || ks[1].Name != "ci-renamed" || ks[1].ID != made.ID {
		t.Fatalf("after the rename: %+v", ks)
	}
	// Tenant B sees none of A's keys and revokes none.
	if ks := list(keyB); len(ks) != 1 || ks[0].ID == made.ID || ks[0].ID == first[0].ID {
		t.Fatalf("tenant B's keys: %+v", ks)
	}
	for _, path := range []string{"/api-keys/" + made.ID, "/api-keys/" + first[0].ID} {
		if r := call("DELETE", path, keyB, ""); r.status != http.StatusNotFound {
			t.Errorf("tenant B revoking A's key %s: %s, want 404", path, r)
		}
	}
	if r := call("GET", "/sandboxes", made.Key, ""); r.status != http.StatusOK {
		t.Fatalf("A's key after B's attempts: %s", r)
	}
	// A revokes its first key with the new one: refused at once.
	if r := call("DELETE", "/api-keys/"+first[0].ID, made.Key, ""); r.status != http.StatusNoContent {
		t.Fatalf("revoke the first key: %s", r)
	}
	if r := call("GET", "/sandboxes", keyA, ""); r.status != http.StatusUnauthorized {
		t.Errorf("the revoked key: GET /sandboxes %s, want 401", r)
	}
	if r := call("DELETE", "/api-keys/"+made.ID, made.Key, ""); r.status != http.StatusConflict || !strings.Contains(r.body, "last") {
		t.Errorf("revoking the last key: %s, want 409 saying it is the last", r)
	}
	for _, bad := range []string{`{"name":""}`, `{"name":"a\nb"}`, `{"nom":"x"}`} {
		if r := call("POST", "/api-keys", made.Key, bad); r.status != http.StatusBadRequest {
			t.Errorf("POST /api-keys %s: %s, want 400", bad, r)
		}
	}
	if r := call("POST", "/access-tokens", made.Key, `{"name":"x"}`); r.status != http.StatusGone {
		t.Errorf("POST /access-tokens: %s, want 410 as E2B answers", r)
	}
	s.stopAndCheckClean()
}
