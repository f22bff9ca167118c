package serve

import (
	"context"
	"fmt"
	"net/http"
	"time"

	"github.com/containerd/errdefs"

	"hutch.dev/hutch/engine"
	"hutch.dev/hutch/serve/placement"
)

func (s *Server) pauseSandbox(r *http.Request, tenantName string) (int, any, error) {
	var body struct {
		Memory *bool `json:"memory"`
	}
	if err := decodeBody(r, &body); err != nil {
		return 0, nil, err
	}
	if body.Memory != nil && !*body.Memory {
		return 0, nil, fmt.Errorf("memory false (a filesystem-only pause) is not supported by hutch serve: %w", errdefs.ErrNotImplemented)
	}
	sb, err := s.owned(r.Context(), tenantName, r.PathValue("id"))
	if err != nil {
		return 0, nil, err
	}
	if sb.State == engine.StatePaused {
		return 0, nil, fmt.Errorf("sandbox %s is already paused: %w", sb.ID, errdefs.ErrConflict)
	}
	s.forget(sb.ID)
	if err := s.place.Pause(context.WithoutCancel(r.Context()), sb); err != nil {
		return 0, nil, err
	}
	return http.StatusNoContent, nil, nil
}

// resumeSandbox is the deprecated POST /sandboxes/{id}/resume: 409 if the
// sandbox is not paused.
func (s *Server) resumeSandbox(r *http.Request, tenantName string) (int, any, error) {
	var body struct {
		Timeout   *int64 `json:"timeout"`
		AutoPause *bool  `json:"autoPause"`
	}
	if err := decodeBody(r, &body); err != nil {
		return 0, nil, err
	}
	timeout, err := checkTimeout(body.Timeout, defaultTimeout)
	if err != nil {
		return 0, nil, err
	}
	sb, err := s.owned(r.Context(), tenantName, r.PathValue("id"))
	if err != nil {
		return 0, nil, err
	}
	if sb.State != engine.StatePaused {
		return 0, nil, fmt.Errorf("sandbox %s is %s, not paused: %w", sb.ID, sb.State, errdefs.ErrConflict)
	}
	if sb, err = s.resume(r.Context(), sb, tenantName); err != nil {
		return 0, nil, err
	}
	if sb, err = s.extend(context.WithoutCancel(r.Context()), sb.ID, timeout); err != nil {
		return 0, nil, err
	}
	out, err := s.sandboxJSON(sb)
	if err != nil {
		return 0, nil, err
	}
	return http.StatusCreated, out, nil
}

// connectSandbox returns a sandbox's connection details, resuming it if
// it is paused (201) and setting its timeout.
func (s *Server) connectSandbox(r *http.Request, tenantName string) (int, any, error) {
	var body struct {
		Timeout *int64 `json:"timeout"`
		Memory  *bool  `json:"memory"`
	}
	if err := decodeBody(r, &body); err != nil {
		return 0, nil, err
	}
	if body.Memory != nil && !*body.Memory {
		return 0, nil, fmt.Errorf("memory false (resume by reboot) is not supported by hutch serve: %w", errdefs.ErrNotImplemented)
	}
	sb, err := s.owned(r.Context(), tenantName, r.PathValue("id"))
	if err != nil {
		return 0, nil, err
	}
	status := http.StatusOK
	if sb.State == engine.StatePaused {
		if sb, err = s.resume(r.Context(), sb, tenantName); err != nil {
			return 0, nil, err
		}
		status = http.StatusCreated
	}
	if sb.State != engine.StateRunning {
		return 0, nil, fmt.Errorf("sandbox %s is %s: %w", sb.ID, sb.State, errdefs.ErrNotFound)
	}
	if body.Timeout != nil {
		timeout, err := checkTimeout(body.Timeout, 0)
		if err != nil {
			return 0, nil, err
		}
		// Connecting never shortens a sandbox's life.
		if sb.Deadline == nil || time.Until(*sb.Deadline) < timeout {
			if sb, err = s.extend(context.WithoutCancel(r.Context()), sb.ID, timeout); err != nil {
				return 0, nil, err
			}
		}
	}
	out, err := s.sandboxJSON(sb)
	if err != nil {
		return 0, nil, err
	}
	return status, out, nil
}

func (s *Server) setTimeout(r *http.Request, tenantName string) (int, any, error) {
	var body struct {
		Timeout *int64 `json:"timeout"`
	}
	if err := decodeBody(r, &body); err != nil {
		return 0, nil, err
	}
	if body.Timeout == nil {
		return 0, nil, fmt.Errorf("timeout: required: %w", errdefs.ErrInvalidArgument)
	}
	timeout, err := checkTimeout(body.Timeout, 0)
	if err != nil {
		return 0, nil, err
	}
	sb, err := s.owned(r.Context(), tenantName, r.PathValue("id"))
	if err != nil {
		return 0, nil, err
	}
	if _, err := s.extend(context.WithoutCancel(r.Context()), sb.ID, timeout); err != nil {
		return 0, nil, err
	}
	return http.StatusNoContent, nil, nil
}

// refresh extends a sandbox's life by duration seconds (E2B's default
// when none is given: its timeout's default).
func (s *Server) refresh(r *http.Request, tenantName string) (int, any, error) {
	var body struct {
		Duration *int64 `json:"duration"`
	}
	if err := decodeBody(r, &body); err != nil {
		return 0, nil, err
	}
	d, err := checkTimeout(body.Duration, defaultTimeout)
	if err != nil {
		return 0, nil, err
	}
	if d > time.Hour {
		return 0, nil, fmt.Errorf("duration %s: at most 3600 seconds: %w", d, errdefs.ErrInvalidArgument)
	}
	sb, err := s.owned(r.Context(), tenantName, r.PathValue("id"))
	if err != nil {
		return 0, nil, err
	}
	left := time.Duration(0)
	if sb.Deadline != nil {
		left = max(0, time.Until(*sb.Deadline))
	}
	if _, err := s.extend(context.WithoutCancel(r.Context()), sb.ID, max(left, d)); err != nil {
		return 0, nil, err
	}
	return http.StatusNoContent, nil, nil
}

// forkResult is one entry of a fork's answer.
type forkResult struct {
	Sandbox *sandboxJSON `json:"sandbox,omitempty"`
	Error   *apiError    `json:"error,omitempty"`
}

func (s *Server) forkSandbox(r *http.Request, tenantName string) (int, any, error) {
	var body struct {
		Timeout *int64 `json:"timeout"`
		Count   *int   `json:"count"`
		// CheckpointID, hutch's own: fork from this checkpoint of the
		// sandbox instead of from the sandbox now.
		CheckpointID *string `json:"checkpointID"`
	}
	if err := decodeBody(r, &body); err != nil {
		return 0, nil, err
	}
	count := 1
	if body.Count != nil {
		count = *body.Count
	}
	if count < 1 || count > 20 {
		return 0, nil, fmt.Errorf("count %d: want 1 to 20: %w", count, errdefs.ErrInvalidArgument)
	}
	timeout, err := checkTimeout(body.Timeout, defaultTimeout)
	if err != nil {
		return 0, nil, err
	}
	if body.CheckpointID != nil {
		if err := engine.ValidCheckpointID(*body.CheckpointID); err != nil {
			return 0, nil, err
		}
		if err := s.place.Unsupported(placement.FeatureCheckpoints, "forks from checkpoints"); err != nil {
			return 0, nil, err
		}
	}
	parent, err := s.owned(r.Context(), tenantName, r.PathValue("id"))
	if err != nil {
		return 0, nil, err
	}
	if body.CheckpointID == nil && parent.State != engine.StateRunning {
		return 0, nil, fmt.Errorf("sandbox %s is %s: only a running sandbox forks: %w", parent.ID, parent.State, errdefs.ErrConflict)
	}
	u := placement.UsageOf(parent.CPUs, parent.Memory, parent.Disk)
	u.Sandboxes, u.CPUs, u.Memory, u.Disk = count, u.CPUs*float64(count), u.Memory*int64(count), u.Disk*int64(count)
	release, err := s.admit(r.Context(), tenantName, u)
	if err != nil {
		return 0, nil, err
	}
	defer release()
	var kids []placement.Forked
	if body.CheckpointID != nil {
		kids, err = s.place.ForkFrom(context.WithoutCancel(r.Context()), parent, *body.CheckpointID, count, timeout)
	} else {
		kids, err = s.place.Fork(context.WithoutCancel(r.Context()), parent, count, timeout)
	}
	if err != nil {
		return 0, nil, err
	}
	out := make([]forkResult, 0, len(kids))
	for _, kid := range kids {
		if kid.Err != nil {
			out = append(out, forkResult{Error: &apiError{Code: httpStatus(kid.Err), Message: message(kid.Err)}})
			continue
		}
		sj, err := s.sandboxJSON(kid.Sandbox)
		if err != nil {
			out = append(out, forkResult{Error: &apiError{Code: httpStatus(err), Message: message(err)}})
			continue
		}
		out = append(out, forkResult{Sandbox: &sj})
	}
	return http.StatusCreated, out, nil
}

// extend sets sandbox id's life to d from now (0: no deadline), keeping
// what happens at its end.
func (s *Server) extend(ctx context.Context, id string, d time.Duration) (*engine.Sandbox, error) {
	return s.place.SetTimeout(ctx, id, d)
}
