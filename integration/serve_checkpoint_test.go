package integration

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
)

type apiCheckpoint struct {
	CheckpointID string `json:"checkpointID"`
	SandboxID    string `json:"sandboxID"`
	ParentID     string `json:"parentID"`
	Message      string `json:"message"`
	SizeBytes    int64  `json:"sizeBytes"`
	Current      bool   `json:"current"`
}

// TestServeCheckpoints drives the checkpoint endpoints of `hutch serve`
// (hutch's own, beside E2B's API): take, list, diff, restore in place
// (same ID and tokens), fork from one, remove; another tenant's
// sandbox and checkpoint are not found; a bad ID is a 400; the
// checkpoints count for max-snapshots.
func TestServeCheckpoints(t *testing.T) {
	srv := newServer(t, "")
	key := srv.tenantAdd("agents", "--max-snapshots", "2")
	other := srv.tenantAdd("others")
	srv.serve()
	auth := map[string]string{"X-API-KEY": key, "Content-Type": "application/json"}
	sb := srv.createSandbox(key, "busybox")
	path := "/sandboxes/" + sb.SandboxID + "/checkpoints"

	r := srv.do("POST", path, strings.NewReader(`{"message":"clean"}`), auth)
	var ck apiCheckpoint
	if r.status != http.StatusCreated || json.Unmarshal([]byte(r.body), &ck) != nil || !strings.HasPrefix(ck.CheckpointID, "ck-") ||
		ck.SandboxID != sb.SandboxID || ck.Message != "clean" || !ck.Current || ck.SizeBytes == 0 {
		t.Fatalf("POST %s: %s", path, r)
	}
	srv.ok("exec", sb.SandboxID, "--", "sh", "-c", "echo later > /root/later")

	r = srv.do("GET", path+"/"+ck.CheckpointID+"/diff", nil, auth)
	var chs []struct{ Kind, Path string }
	if r.status != http.StatusOK || json.Unmarshal([]byte(r.body), &chs) != nil || len(chs) != 1 || chs[0].Kind != "A" || chs[0].Path != "/root/later" {
		t.Fatalf("GET diff: %s", r)
	}

	r = srv.do("POST", path+"/"+ck.CheckpointID+"/restore", nil, auth)
	var restored createdSandbox
	if r.status != http.StatusOK || json.Unmarshal([]byte(r.body), &restored) != nil ||
		restored.SandboxID != sb.SandboxID || restored.EnvdAccessToken != sb.EnvdAccessToken {
		t.Fatalf("POST restore: %s (created as %+v)", r, sb)
	}
	if out := srv.run(nil, "exec", sb.SandboxID, "--", "test", "-e", "/root/later"); out.code == 0 {
		t.Fatal("a file made after the checkpoint is there after the restore")
	}
	r = srv.do("GET", path, nil, auth)
	var cks []apiCheckpoint
	if r.status != http.StatusOK || json.Unmarshal([]byte(r.body), &cks) != nil || len(cks) != 1 || cks[0].CheckpointID != ck.CheckpointID || !cks[0].Current {
		t.Fatalf("GET %s: %s", path, r)
	}

	// Another tenant sees neither the sandbox nor its checkpoints.
	oauth := map[string]string{"X-API-KEY": other, "Content-Type": "application/json"}
	for _, c := range []struct{ method, path string }{
		{"GET", path}, {"POST", path}, {"POST", path + "/" + ck.CheckpointID + "/restore"},
		{"DELETE", path + "/" + ck.CheckpointID}, {"GET", path + "/" + ck.CheckpointID + "/diff"},
	} {
		r := srv.do(c.method, c.path, strings.NewReader("{}"), oauth)
		if r.status != http.StatusNotFound {
			t.Fatalf("another tenant's %s %s: %s", c.method, c.path, r)
		}
	}
	// Not checkpoint IDs: 400, naming what is wrong.
	for _, bad := range []string{"ck-..%2F..%2Fetc", "ck-ZZZZZZZZZZZZ", "passwd"} {
		r := srv.do("POST", path+"/"+bad+"/restore", nil, auth)
		code, msg, err := r.errorBody()
		if r.status != http.StatusBadRequest || err != nil || code != 400 || !strings.Contains(msg, "not a checkpoint ID") {
			t.Fatalf("restore to %q: %s", bad, r)
		}
	}
	r = srv.do("GET", path+"/ck-0123456789ab/diff", nil, auth)
	if r.status != http.StatusNotFound {
		t.Fatalf("diff of a checkpoint the sandbox lacks: %s", r)
	}

	// A fork from the checkpoint.
	r = srv.do("POST", "/sandboxes/"+sb.SandboxID+"/fork", strings.NewReader(`{"checkpointID":"`+ck.CheckpointID+`","timeout":300}`), auth)
	var forks []struct {
		Sandbox *createdSandbox `json:"sandbox"`
	}
	if r.status != http.StatusCreated || json.Unmarshal([]byte(r.body), &forks) != nil || len(forks) != 1 || forks[0].Sandbox == nil {
		t.Fatalf("fork from a checkpoint: %s", r)
	}
	kid := forks[0].Sandbox.SandboxID

	// max-snapshots 2: a second checkpoint fits, a third does not.
	if r := srv.do("POST", path, strings.NewReader(`{}`), auth); r.status != http.StatusCreated {
		t.Fatalf("second checkpoint: %s", r)
	}
	if r := srv.do("POST", path, strings.NewReader(`{}`), auth); r.status != http.StatusTooManyRequests && r.status != http.StatusForbidden {
		t.Fatalf("a checkpoint over max-snapshots: %s", r)
	}
	if r := srv.do("DELETE", path+"/"+ck.CheckpointID, nil, auth); r.status != http.StatusNoContent {
		t.Fatalf("DELETE checkpoint: %s", r)
	}
	if r := srv.do("POST", path, strings.NewReader(`{"keep":1}`), auth); r.status != http.StatusCreated {
		t.Fatalf("a checkpoint once one was removed: %s", r)
	}
	for _, id := range []string{kid, sb.SandboxID} {
		if r := srv.do("DELETE", "/sandboxes/"+id, nil, auth); r.status != http.StatusNoContent {
			t.Fatalf("DELETE sandbox: %s", r)
		}
	}
	srv.stopAndCheckClean()
	srv.assertNoCheckpointsLeft()
}
