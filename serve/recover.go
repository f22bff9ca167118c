package serve

import (
	"context"
	"time"

	"hutch.dev/hutch/engine"
)

// sweepInterval is how often the server removes its dead sandboxes.
const sweepInterval = 30 * time.Second

// Recover makes the server's view whole after a restart or a crash: it
// removes its sandboxes that a killed server left half-created and those
// that stopped (an E2B sandbox that is neither running nor paused is
// gone). Running and paused sandboxes are adopted as they are: everything
// the server knows of them is in the engine's records.
//
// A sandbox is removed only if it looks dead twice, recheck apart: a
// sandbox that a pause (of the server's or of its lifetime watchdog) is
// checkpointing looks stopped for a moment.
func (s *Server) Recover(ctx context.Context, recheck time.Duration) (removed int, err error) {
	if s.kube != nil {
		return s.kubeRecover(ctx)
	}
	seen, err := s.deadSandboxes(ctx)
	if err != nil || len(seen) == 0 {
		return 0, err
	}
	select {
	case <-ctx.Done():
		return 0, ctx.Err()
	case <-time.After(recheck):
	}
	now, err := s.deadSandboxes(ctx)
	if err != nil {
		return 0, err
	}
	for _, sb := range now {
		if _, ok := seen[sb.ID]; !ok {
			continue
		}
		s.forget(sb.ID)
		if err := s.eng.Remove(ctx, sb.ID, true); err != nil {
			s.log.Warn("remove dead sandbox", "sandbox", sb.ID, "err", err)
			continue
		}
		removed++
		s.log.Info("removed dead sandbox", "sandbox", sb.ID, "tenant", sb.Labels[labelTenant], "state", sb.State)
	}
	return removed, nil
}

// deadSandboxes are the server's sandboxes that are dead now, by ID.
func (s *Server) deadSandboxes(ctx context.Context) (map[string]*engine.Sandbox, error) {
	all, err := s.eng.List(ctx)
	if err != nil {
		return nil, err
	}
	out := map[string]*engine.Sandbox{}
	for _, sb := range all {
		if sb.Labels[labelTenant] != "" && dead(sb) {
			out[sb.ID] = sb
		}
	}
	return out, nil
}

// dead reports whether sb is of no more use: stopped, or left half-made
// by a create or fork whose process died.
func dead(sb *engine.Sandbox) bool {
	return sb.State == engine.StateStopped || sb.Abandoned()
}

// sweep runs Recover every sweepInterval until the server closes.
func (s *Server) sweep() {
	every := sweepInterval
	if s.kube != nil {
		every = kubeSweepInterval
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-s.stopCtx.Done():
			return
		case <-t.C:
			if _, err := s.Recover(s.stopCtx, 3*time.Second); err != nil && s.stopCtx.Err() == nil {
				s.log.Warn("sweep", "err", err)
			}
		}
	}
}
