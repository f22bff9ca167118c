package client

import (
	"context"
	"errors"
	"net/http"
	"net/url"
	"time"
)

// Checkpoint is one checkpoint of a sandbox's tree (hutch's extension:
// E2B has no checkpoints).
type Checkpoint struct {
	CheckpointID string    `json:"checkpointID"`
	SandboxID    string    `json:"sandboxID"`
	ParentID     string    `json:"parentID,omitempty"`
	Message      string    `json:"message,omitempty"`
	CreatedAt    time.Time `json:"createdAt"`
	SizeBytes    int64     `json:"sizeBytes"`
	MemoryBytes  int64     `json:"memoryBytes"`
	FilesBytes   int64     `json:"filesBytes"`
	DiskBytes    int64     `json:"diskBytes"`
	// Current: the sandbox is at it (the last taken or restored).
	Current bool `json:"current"`
}

// Change is one path of a checkpoint diff: Kind A (added), M (changed),
// D (deleted) or R (renamed from From).
type Change struct {
	Kind    string `json:"kind"`
	Path    string `json:"path"`
	From    string `json:"from,omitempty"`
	Type    string `json:"type"`
	Mode    uint32 `json:"mode,omitempty"`
	OldMode uint32 `json:"oldMode,omitempty"`
	Link    string `json:"link,omitempty"`
}

// CheckpointLive names the sandbox's files now in DiffCheckpoints.
const CheckpointLive = "live"

func checkpointsPath(id string) string { return "/sandboxes/" + url.PathEscape(id) + "/checkpoints" }

// Checkpoint takes a checkpoint of sandbox id (memory, processes, files);
// the sandbox runs on. keep, if above 0, keeps only that many of its
// newest checkpoints.
func (c *Client) Checkpoint(ctx context.Context, id, message string, keep int) (*Checkpoint, error) {
	body := map[string]any{"message": message}
	if keep > 0 {
		body["keep"] = keep
	}
	var out Checkpoint
	if _, err := c.do(ctx, http.MethodPost, checkpointsPath(id), body, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// Checkpoints lists sandbox id's checkpoints, oldest first.
func (c *Client) Checkpoints(ctx context.Context, id string) ([]Checkpoint, error) {
	var out []Checkpoint
	if _, err := c.do(ctx, http.MethodGet, checkpointsPath(id), nil, &out); err != nil {
		return nil, err
	}
	return out, nil
}

// RemoveCheckpoint deletes checkpoint ck of sandbox id.
func (c *Client) RemoveCheckpoint(ctx context.Context, id, ck string) error {
	_, err := c.do(ctx, http.MethodDelete, checkpointsPath(id)+"/"+url.PathEscape(ck), nil, nil)
	return err
}

// Restore puts sandbox id back at its checkpoint ck, in place: same ID,
// address and tokens; its processes and files as they were then.
func (c *Client) Restore(ctx context.Context, id, ck string) (*Info, error) {
	var out Info
	if _, err := c.do(ctx, http.MethodPost, checkpointsPath(id)+"/"+url.PathEscape(ck)+"/restore", struct{}{}, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// DiffCheckpoints lists the files changed in sandbox id from checkpoint a
// to b (a checkpoint, or CheckpointLive).
func (c *Client) DiffCheckpoints(ctx context.Context, id, a, b string) ([]Change, error) {
	var out []Change
	p := checkpointsPath(id) + "/" + url.PathEscape(a) + "/diff?to=" + url.QueryEscape(b)
	if _, err := c.do(ctx, http.MethodGet, p, nil, &out); err != nil {
		return nil, err
	}
	return out, nil
}

// ForkFrom makes count running sandboxes from checkpoint ck of sandbox id.
func (c *Client) ForkFrom(ctx context.Context, id, ck string, count int, timeout time.Duration) ([]*Sandbox, error) {
	var out []struct {
		Sandbox *sandboxJSON `json:"sandbox"`
		Error   *Error       `json:"error"`
	}
	body := map[string]any{"count": count, "timeout": int(timeout / time.Second), "checkpointID": ck}
	if _, err := c.do(ctx, http.MethodPost, "/sandboxes/"+url.PathEscape(id)+"/fork", body, &out); err != nil {
		return nil, err
	}
	var sbs []*Sandbox
	var errs []error
	for _, r := range out {
		if r.Error != nil {
			errs = append(errs, r.Error)
			continue
		}
		if r.Sandbox != nil {
			sbs = append(sbs, c.sandbox(*r.Sandbox))
		}
	}
	return sbs, errors.Join(errs...)
}
