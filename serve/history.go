package serve

import (
	"context"
	"sync"
	"time"

	"hutch.dev/hutch/engine"
	"hutch.dev/hutch/serve/placement"
)

// The metrics history: each sandbox's recent samples of its use, what
// GET /sandboxes/{id}/metrics answers for a window (start, end) and what
// an operator's console charts. The server samples every running
// sandbox every historyInterval, and a metrics call adds a sample of now
// when the last is older than historyMinGap. A sandbox keeps at most
// historySamples (an hour at the interval): the oldest go first. A
// paused sandbox keeps its series; a removed one's is dropped at the
// next sampling. Nothing of it is stored: a restarted server starts
// every series anew.
const (
	historyInterval = 5 * time.Second
	historyMinGap   = time.Second
	historySamples  = 720
)

// metricSample is one sample of a sandbox's use, as E2B's SandboxMetric.
type metricSample struct {
	Timestamp     time.Time `json:"timestamp"`
	TimestampUnix int64     `json:"timestampUnix"`
	CPUCount      int       `json:"cpuCount"`
	CPUUsedPct    float64   `json:"cpuUsedPct"`
	MemUsed       int64     `json:"memUsed"`
	MemTotal      int64     `json:"memTotal"`
	DiskUsed      int64     `json:"diskUsed"`
	DiskTotal     int64     `json:"diskTotal"`
}

// sampleOf is sb's sample from its stats at now.
func sampleOf(sb *engine.Sandbox, st *engine.Stats, now time.Time) metricSample {
	now = now.UTC()
	return metricSample{
		Timestamp: now, TimestampUnix: now.Unix(), CPUCount: max(1, int(sb.CPUs+0.5)),
		CPUUsedPct: st.CPU.Percent, MemUsed: int64(st.Memory.Usage), MemTotal: sb.Memory,
		DiskUsed: int64(st.Disk.Used), DiskTotal: sb.Disk,
	}
}

// history is every sandbox's series of samples, each bounded.
type history struct {
	// mu guards series.
	mu     sync.Mutex
	series map[string][]metricSample
	// max is the samples a series keeps.
	max int
}

func newHistory(max int) *history {
	return &history{series: map[string][]metricSample{}, max: max}
}

// add appends m to sandbox id's series, dropping its oldest past max.
func (h *history) add(id string, m metricSample) {
	h.mu.Lock()
	defer h.mu.Unlock()
	s := append(h.series[id], m)
	if len(s) > h.max {
		// Copied down, so that the array does not grow without bound.
		s = append(s[:0:0], s[len(s)-h.max:]...)
	}
	h.series[id] = s
}

// last is the time of sandbox id's newest sample; zero if it has none.
func (h *history) last(id string) time.Time {
	h.mu.Lock()
	defer h.mu.Unlock()
	s := h.series[id]
	if len(s) == 0 {
		return time.Time{}
	}
	return s[len(s)-1].Timestamp
}

// window is sandbox id's samples from start to end, whole seconds
// inclusive (a zero bound is open), oldest first.
func (h *history) window(id string, start, end time.Time) []metricSample {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := []metricSample{}
	for _, m := range h.series[id] {
		sec := m.Timestamp.Unix()
		if (!start.IsZero() && sec < start.Unix()) || (!end.IsZero() && sec > end.Unix()) {
			continue
		}
		out = append(out, m)
	}
	return out
}

// keep drops the series of every sandbox not in ids.
func (h *history) keep(ids map[string]bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for id := range h.series {
		if !ids[id] {
			delete(h.series, id)
		}
	}
}

// count is the number of series held.
func (h *history) count() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.series)
}

// sampleAll adds a sample of every running sandbox of every tenant to
// the history and drops the series of sandboxes that are gone. A
// placement without sandbox metrics samples nothing.
func (s *Server) sampleAll(ctx context.Context) {
	if s.place.Unsupported(placement.FeatureMetrics, "sandbox metrics") != nil {
		return
	}
	all, err := s.place.List(ctx, "")
	if err != nil {
		s.log.Debug("metrics history: list", "err", err)
		return
	}
	ids := map[string]bool{}
	for _, sb := range all {
		if sb.Labels[placement.LabelTenant] == "" {
			continue
		}
		ids[sb.ID] = true
		if sb.State == engine.StateRunning {
			if err := s.sampleOne(ctx, sb); err != nil {
				s.log.Debug("metrics history: sample", "sandbox", sb.ID, "err", err)
			}
		}
	}
	s.history.keep(ids)
}

// sampleOne adds a sample of running sandbox sb now.
func (s *Server) sampleOne(ctx context.Context, sb *engine.Sandbox) error {
	st, err := s.place.Stats(ctx, sb.ID)
	if err != nil {
		return err
	}
	s.history.add(sb.ID, sampleOf(sb, st, time.Now()))
	return nil
}

// sampleHistory samples every historyInterval until the server closes.
func (s *Server) sampleHistory() {
	t := time.NewTicker(historyInterval)
	defer t.Stop()
	for {
		select {
		case <-s.stopCtx.Done():
			return
		case <-t.C:
			s.sampleAll(s.stopCtx)
		}
	}
}
