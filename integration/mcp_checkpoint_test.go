package integration

import (
	"strings"
	"testing"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
)

// TestMCPCheckpoints uses the save-point tools as a model would: save
// point, a risky change, diff, undo; the save points listed; bad IDs
// refused as tool errors; the same through `hutch mcp --server`.
func TestMCPCheckpoints(t *testing.T) {
	e := newEnv(t)
	checkMCPCheckpoints(t, mcpServe(t, e))
	srv := newServer(t, "")
	key := srv.tenantAdd("agents")
	srv.serve()
	checkMCPCheckpoints(t, mcpServeRemote(t, srv, key))
	srv.stopAndCheckClean()
}

func checkMCPCheckpoints(t *testing.T, cs *sdk.ClientSession) {
	t.Helper()
	var sb mcpSandbox
	mustCall(t, cs, "create_sandbox", map[string]any{"image": "busybox"}, &sb)
	id := sb.SandboxID
	mustCall(t, cs, "write_file", map[string]any{"sandbox_id": id, "path": "/work/app.conf", "content": "version=1\n"}, nil)
	var ck struct {
		CheckpointID string `json:"checkpoint_id"`
		Current      bool   `json:"current"`
		SizeBytes    int64  `json:"size_bytes"`
	}
	mustCall(t, cs, "checkpoint", map[string]any{"sandbox_id": id, "message": "before the upgrade"}, &ck)
	if !strings.HasPrefix(ck.CheckpointID, "ck-") || !ck.Current || ck.SizeBytes == 0 {
		t.Fatalf("checkpoint: %+v", ck)
	}
	var run mcpRun
	mustCall(t, cs, "run_command", map[string]any{"sandbox_id": id, "command": "echo version=2 > /work/app.conf && echo junk > /work/junk"}, &run)
	var diff struct {
		Changes []struct{ Kind, Path string } `json:"changes"`
	}
	mustCall(t, cs, "diff_checkpoints", map[string]any{"sandbox_id": id, "from": ck.CheckpointID}, &diff)
	if len(diff.Changes) != 2 || diff.Changes[0].Kind != "M" || diff.Changes[0].Path != "/work/app.conf" || diff.Changes[1].Kind != "A" {
		t.Fatalf("diff_checkpoints: %+v", diff)
	}
	mustCall(t, cs, "restore_checkpoint", map[string]any{"sandbox_id": id, "checkpoint_id": ck.CheckpointID}, &sb)
	if sb.SandboxID != id || sb.State != "running" {
		t.Fatalf("restore_checkpoint: %+v", sb)
	}
	mustCall(t, cs, "run_command", map[string]any{"sandbox_id": id, "command": "cat /work/app.conf; ls /work"}, &run)
	if run.Stdout != "version=1\napp.conf\n" {
		t.Fatalf("after the undo: %+v", run)
	}
	var l struct {
		Checkpoints []struct {
			CheckpointID string `json:"checkpoint_id"`
			Message      string `json:"message"`
			Current      bool   `json:"current"`
		} `json:"checkpoints"`
	}
	mustCall(t, cs, "list_checkpoints", map[string]any{"sandbox_id": id}, &l)
	if len(l.Checkpoints) != 1 || l.Checkpoints[0].CheckpointID != ck.CheckpointID || l.Checkpoints[0].Message != "before the upgrade" || !l.Checkpoints[0].Current {
		t.Fatalf("list_checkpoints: %+v", l)
	}
	wantToolError(t, cs, "restore_checkpoint", map[string]any{"sandbox_id": id, "checkpoint_id": "../../etc/passwd"}, "not a checkpoint ID")
	wantToolError(t, cs, "restore_checkpoint", map[string]any{"sandbox_id": id, "checkpoint_id": "ck-0123456789ab"}, "no checkpoint")
	wantToolError(t, cs, "diff_checkpoints", map[string]any{"sandbox_id": id, "from": "x"}, "not a checkpoint ID")
	mustCall(t, cs, "remove_sandbox", map[string]any{"sandbox_id": id}, nil)
}
