package serve

import (
	"context"
	"fmt"
	"net/http"
	"time"

	"github.com/containerd/errdefs"

	"hutch.dev/hutch/engine"
	"hutch.dev/hutch/serve/placement"
	"hutch.dev/hutch/serve/tenant"
)

// Checkpoints are an extension of hutch's (E2B has no such calls): a
// sandbox's tree of checkpoints, each its memory, processes and files at
// one moment, and a restore in place to any of them.
//
//	POST   /sandboxes/{id}/checkpoints                  {"message", "keep"} -> 201 checkpoint
//	GET    /sandboxes/{id}/checkpoints                  -> 200 [checkpoint], oldest first
//	DELETE /sandboxes/{id}/checkpoints/{checkpointID}   -> 204
//	POST   /sandboxes/{id}/checkpoints/{checkpointID}/restore -> 200 sandbox
//	GET    /sandboxes/{id}/checkpoints/{checkpointID}/diff[?to=B|live] -> 200 [change]
//	POST   /sandboxes/{id}/fork                         {"checkpointID", ...}: forks from one

// checkpointJSON is one checkpoint as the API gives it.
type checkpointJSON struct {
	CheckpointID string    `json:"checkpointID"`
	SandboxID    string    `json:"sandboxID"`
	ParentID     string    `json:"parentID,omitempty"`
	Message      string    `json:"message,omitempty"`
	CreatedAt    time.Time `json:"createdAt"`
	// SizeBytes is MemoryBytes and FilesBytes: what it holds on disk.
	SizeBytes   int64 `json:"sizeBytes"`
	MemoryBytes int64 `json:"memoryBytes"`
	FilesBytes  int64 `json:"filesBytes"`
	// DiskBytes is what it takes on disk of its own: the chunks it added
	// to those of the checkpoints before, and its memory while kept
	// whole (the one the sandbox is at).
	DiskBytes int64 `json:"diskBytes"`
	// Current: the sandbox is at it (the last taken or restored).
	Current bool `json:"current"`
}

func checkpointOut(c engine.CheckpointInfo) checkpointJSON {
	return checkpointJSON{
		CheckpointID: c.ID, SandboxID: c.Sandbox, ParentID: c.Parent, Message: c.Message,
		CreatedAt: c.Created, SizeBytes: c.Size(), MemoryBytes: c.MemorySize, FilesBytes: c.FilesSize,
		DiskBytes: c.Disk, Current: c.Current,
	}
}

// changeJSON is one path of a checkpoint diff.
type changeJSON struct {
	Kind    string `json:"kind"`
	Path    string `json:"path"`
	From    string `json:"from,omitempty"`
	Type    string `json:"type"`
	Mode    uint32 `json:"mode,omitempty"`
	OldMode uint32 `json:"oldMode,omitempty"`
	Link    string `json:"link,omitempty"`
}

// checkpointed is the tenant's sandbox of the request, on a backend that
// keeps checkpoints, and the checkpoint the path names (if it names one),
// validated.
func (s *Server) checkpointed(r *http.Request, tenantName string) (*engine.Sandbox, string, error) {
	ck := r.PathValue("checkpointID")
	if ck != "" {
		if err := engine.ValidCheckpointID(ck); err != nil {
			return nil, "", err
		}
	}
	sb, err := s.owned(r.Context(), tenantName, r.PathValue("id"))
	if err != nil {
		return nil, "", err
	}
	if err := s.place.Unsupported(placement.FeatureCheckpoints, "checkpoints"); err != nil {
		return nil, "", err
	}
	return sb, ck, nil
}

// createCheckpoint is POST /sandboxes/{id}/checkpoints. A paused sandbox
// is resumed first, as for a snapshot. It counts for the tenant's
// max-snapshots; its disk for max-disk once taken.
func (s *Server) createCheckpoint(r *http.Request, tenantName string) (int, any, error) {
	var body struct {
		Message string `json:"message"`
		Keep    *int   `json:"keep"`
	}
	if err := decodeBody(r, &body); err != nil {
		return 0, nil, err
	}
	keep := 0
	if body.Keep != nil {
		if keep = *body.Keep; keep < 1 {
			return 0, nil, fmt.Errorf("keep %d: want at least 1 (or no keep, for all): %w", keep, errdefs.ErrInvalidArgument)
		}
	}
	sb, _, err := s.checkpointed(r, tenantName)
	if err != nil {
		return 0, nil, err
	}
	if sb.State == engine.StatePaused {
		if sb, err = s.resume(r.Context(), sb, tenantName); err != nil {
			return 0, nil, err
		}
	}
	release, err := s.admit(r.Context(), tenantName, checkpointUsage())
	if err != nil {
		return 0, nil, err
	}
	defer release()
	unlock := s.locks.Lock(sb.ID)
	defer unlock()
	info, err := s.place.Checkpoint(context.WithoutCancel(r.Context()), sb.ID, engine.CheckpointRequest{Message: body.Message, Keep: keep})
	if err != nil {
		return 0, nil, err
	}
	return http.StatusCreated, checkpointOut(info), nil
}

// listCheckpoints is GET /sandboxes/{id}/checkpoints.
func (s *Server) listCheckpoints(r *http.Request, tenantName string) (int, any, error) {
	sb, _, err := s.checkpointed(r, tenantName)
	if err != nil {
		return 0, nil, err
	}
	cks, err := s.place.Checkpoints(r.Context(), sb.ID)
	if err != nil {
		return 0, nil, err
	}
	out := make([]checkpointJSON, 0, len(cks))
	for _, c := range cks {
		out = append(out, checkpointOut(c))
	}
	return http.StatusOK, out, nil
}

// deleteCheckpoint is DELETE /sandboxes/{id}/checkpoints/{checkpointID}.
func (s *Server) deleteCheckpoint(r *http.Request, tenantName string) (int, any, error) {
	sb, ck, err := s.checkpointed(r, tenantName)
	if err != nil {
		return 0, nil, err
	}
	unlock := s.locks.Lock(sb.ID)
	defer unlock()
	if err := s.place.RemoveCheckpoint(context.WithoutCancel(r.Context()), sb.ID, ck); err != nil {
		return 0, nil, err
	}
	return http.StatusNoContent, nil, nil
}

// restoreCheckpoint is POST /sandboxes/{id}/checkpoints/{checkpointID}/restore:
// the sandbox, running or paused, goes back to the checkpoint in place and
// runs; what the server held of its run before (processes, connections
// into its ports) is forgotten. A paused sandbox is admitted as a resume.
func (s *Server) restoreCheckpoint(r *http.Request, tenantName string) (int, any, error) {
	sb, ck, err := s.checkpointed(r, tenantName)
	if err != nil {
		return 0, nil, err
	}
	unlock := s.locks.Lock(sb.ID)
	defer unlock()
	if sb, err = s.sandbox(r.Context(), sb.ID); err != nil {
		return 0, nil, err
	}
	if sb.State == engine.StatePaused {
		release, err := s.admit(r.Context(), tenantName, resumeUsage(sb))
		if err != nil {
			return 0, nil, fmt.Errorf("sandbox %s stays paused: %w", sb.ID, err)
		}
		defer release()
	}
	s.forget(sb.ID)
	if sb, err = s.place.Restore(context.WithoutCancel(r.Context()), sb.ID, ck); err != nil {
		return 0, nil, err
	}
	s.log.Info("restored", "sandbox", sb.ID, "tenant", tenantName, "checkpoint", ck)
	sj, err := s.sandboxJSON(sb)
	if err != nil {
		return 0, nil, err
	}
	return http.StatusOK, sj, nil
}

// diffCheckpoint is GET /sandboxes/{id}/checkpoints/{checkpointID}/diff:
// the files changed from it to ?to= (a checkpoint, or live: the sandbox
// now, the default).
func (s *Server) diffCheckpoint(r *http.Request, tenantName string) (int, any, error) {
	to := r.URL.Query().Get("to")
	if to == "" {
		to = engine.CheckpointLive
	}
	if to != engine.CheckpointLive {
		if err := engine.ValidCheckpointID(to); err != nil {
			return 0, nil, err
		}
	}
	sb, ck, err := s.checkpointed(r, tenantName)
	if err != nil {
		return 0, nil, err
	}
	chs, err := s.place.DiffCheckpoints(r.Context(), sb.ID, ck, to)
	if err != nil {
		return 0, nil, err
	}
	out := make([]changeJSON, 0, len(chs))
	for _, c := range chs {
		out = append(out, changeJSON{
			Kind: c.Kind, Path: c.Path, From: c.From, Type: c.Type,
			Mode: uint32(c.Mode.Perm()), OldMode: uint32(c.OldMode.Perm()), Link: c.Link,
		})
	}
	return http.StatusOK, out, nil
}

// checkpointUsage is what a new checkpoint asks of its tenant's quota
// before it is taken: one more of max-snapshots. Its disk is known once
// taken, and counts from then on (CheckpointsUsage).
func checkpointUsage() tenant.Usage { return tenant.Usage{Snapshots: 1} }
