package kubeplace

import (
	"context"
	"testing"

	"github.com/containerd/errdefs"

	"hutch.dev/hutch/engine"
	"hutch.dev/hutch/serve/placement"
)

// Checkpoint trees are not served on Kubernetes: every call says so with
// ErrNotImplemented, which serve answers with 501.
func TestCheckpointsNotImplemented(t *testing.T) {
	k := &Placement{}
	ctx := context.Background()
	_, e1 := k.Checkpoint(ctx, "id", engine.CheckpointRequest{})
	_, e2 := k.Checkpoints(ctx, "id")
	e3 := k.RemoveCheckpoint(ctx, "id", "ck-0123456789ab")
	_, e4 := k.Restore(ctx, "id", "ck-0123456789ab")
	_, e5 := k.DiffCheckpoints(ctx, "id", "ck-0123456789ab", engine.CheckpointLive)
	_, e6 := k.ForkFrom(ctx, &engine.Sandbox{ID: "id"}, "ck-0123456789ab", 1, 0)
	e7 := k.Unsupported(placement.FeatureCheckpoints, "checkpoints")
	for i, err := range []error{e1, e2, e3, e4, e5, e6, e7} {
		if !errdefs.IsNotImplemented(err) {
			t.Errorf("call %d: %v, want ErrNotImplemented", i+1, err)
		}
	}
	if u, err := k.CheckpointsUsage(ctx, "t"); err != nil || u.Snapshots != 0 || u.Disk != 0 {
		t.Errorf("CheckpointsUsage: %+v %v", u, err)
	}
}
