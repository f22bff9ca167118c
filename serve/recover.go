package serve

import (
	"context"
	"time"
)

// Recover makes the server's view whole after a restart or a crash: its
// placement removes the sandboxes that are of no more use (left
// half-created by a killed server, stopped, past their deadline), the
// server forgetting each first. Running and paused sandboxes are adopted
// as they are: everything the server knows of them is in the
// placement's records. recheck is how long a sandbox that looks dead may
// be given to show it is not (one being checkpointed looks stopped for a
// moment).
func (s *Server) Recover(ctx context.Context, recheck time.Duration) (removed int, err error) {
	return s.place.Recover(ctx, recheck, s.forget)
}

// sweep runs Recover every sweep interval of the placement until the
// server closes.
func (s *Server) sweep() {
	t := time.NewTicker(s.place.SweepInterval())
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
