package serve

import (
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/containerd/errdefs"

	"hutch.dev/hutch/engine"
)

// A tenant's usage over time, E2B's team metrics: how many sandboxes it
// runs at once and how fast it starts them, sampled at each reconcile
// (every two seconds) and kept for an hour.

// teamSamples is how many samples of a tenant are kept.
const teamSamples = 1800

type teamSample struct {
	at         time.Time
	concurrent int
	startRate  float64
}

// sample records each tenant's running sandboxes and the creates since
// the last sample; ev.mu is held.
func (ev *eventHub) sampleLocked(now time.Time, running map[string]int) {
	if ev.usage == nil {
		ev.usage = map[string][]teamSample{}
	}
	dt := now.Sub(ev.sampledAt).Seconds()
	if ev.sampledAt.IsZero() || dt <= 0 {
		dt = reconcileEvery.Seconds()
	}
	seen := map[string]bool{}
	add := func(t string) {
		if seen[t] || t == "" {
			return
		}
		seen[t] = true
		s := append(ev.usage[t], teamSample{at: now, concurrent: running[t], startRate: float64(ev.starts[t]) / dt})
		if len(s) > teamSamples {
			s = s[len(s)-teamSamples:]
		}
		ev.usage[t] = s
	}
	for t := range running {
		add(t)
	}
	for t := range ev.starts {
		add(t)
	}
	for t := range ev.usage {
		add(t)
	}
	ev.starts, ev.sampledAt = map[string]int{}, now
}

// window reads ?start= and ?end= (Unix seconds); missing: all kept.
func window(r *http.Request) (time.Time, time.Time, error) {
	start, end := time.Time{}, time.Now().Add(time.Minute)
	for name, t := range map[string]*time.Time{"start": &start, "end": &end} {
		if v := r.URL.Query().Get(name); v != "" {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil || n < 0 {
				return start, end, fmt.Errorf("%s %q: want Unix seconds, 0 or more: %w", name, clip(v, 30), errdefs.ErrInvalidArgument)
			}
			*t = time.Unix(n, 0)
		}
	}
	if end.Before(start) {
		return start, end, fmt.Errorf("end is before start: %w", errdefs.ErrInvalidArgument)
	}
	return start, end, nil
}

// teamOf checks that a request's teamID is the tenant's own.
func teamOf(r *http.Request, tenantName string) error {
	if r.PathValue("teamID") != tenantName {
		return fmt.Errorf("team %q is not this key's (its team is its tenant, %q): %w", clip(r.PathValue("teamID"), 64), tenantName, errdefs.ErrPermissionDenied)
	}
	return nil
}

func (s *Server) teamSamplesIn(r *http.Request, tenantName string) ([]teamSample, error) {
	if err := teamOf(r, tenantName); err != nil {
		return nil, err
	}
	start, end, err := window(r)
	if err != nil {
		return nil, err
	}
	s.events.mu.Lock()
	defer s.events.mu.Unlock()
	var out []teamSample
	for _, smp := range s.events.usage[tenantName] {
		if !smp.at.Before(start) && !smp.at.After(end) {
			out = append(out, smp)
		}
	}
	return out, nil
}

func teamMetricJSON(smp teamSample) map[string]any {
	return map[string]any{
		"timestamp": smp.at.UTC(), "timestampUnix": smp.at.Unix(),
		"concurrentSandboxes": smp.concurrent, "sandboxStartRate": smp.startRate,
	}
}

// teamMetrics is GET /teams/{teamID}/metrics.
func (s *Server) teamMetrics(r *http.Request, tenantName string) (int, any, error) {
	smps, err := s.teamSamplesIn(r, tenantName)
	if err != nil {
		return 0, nil, err
	}
	out := []map[string]any{}
	for _, smp := range smps {
		out = append(out, teamMetricJSON(smp))
	}
	return http.StatusOK, out, nil
}

// teamMetricsMax is GET /teams/{teamID}/metrics/max?metric=.
func (s *Server) teamMetricsMax(r *http.Request, tenantName string) (int, any, error) {
	metric := r.URL.Query().Get("metric")
	if metric != "concurrent_sandboxes" && metric != "sandbox_start_rate" {
		return 0, nil, fmt.Errorf("metric %q: want concurrent_sandboxes or sandbox_start_rate: %w", clip(metric, 40), errdefs.ErrInvalidArgument)
	}
	smps, err := s.teamSamplesIn(r, tenantName)
	if err != nil {
		return 0, nil, err
	}
	best, bestAt := 0.0, time.Now()
	for _, smp := range smps {
		v := float64(smp.concurrent)
		if metric == "sandbox_start_rate" {
			v = smp.startRate
		}
		if v > best {
			best, bestAt = v, smp.at
		}
	}
	return http.StatusOK, map[string]any{"timestamp": bestAt.UTC(), "timestampUnix": bestAt.Unix(), "value": best}, nil
}

// maxMetricsIDs bounds one GET /sandboxes/metrics, as E2B's does.
const maxMetricsIDs = 100

// sandboxesMetrics is GET /sandboxes/metrics?sandbox_ids=a,b: each of the
// tenant's running sandboxes of those IDs with its latest sample (taken
// now if none is recent). An ID that is not the tenant's, or not
// running, is left out, as an unknown one is.
func (s *Server) sandboxesMetrics(r *http.Request, tenantName string) (int, any, error) {
	if err := checkQuery(r, "sandbox_ids"); err != nil {
		return 0, nil, err
	}
	var ids []string
	for _, v := range r.URL.Query()["sandbox_ids"] {
		for _, id := range strings.Split(v, ",") {
			if id = strings.TrimSpace(id); id != "" && !slices.Contains(ids, id) {
				ids = append(ids, id)
			}
		}
	}
	if len(ids) == 0 || len(ids) > maxMetricsIDs {
		return 0, nil, fmt.Errorf("sandbox_ids: want 1 to %d sandbox IDs, comma-separated: %w", maxMetricsIDs, errdefs.ErrInvalidArgument)
	}
	out := map[string]metricSample{}
	for _, id := range ids {
		sb, err := s.owned(r.Context(), tenantName, id)
		if err != nil || sb.State != engine.StateRunning {
			continue
		}
		if time.Since(s.history.last(sb.ID)) >= historyMinGap {
			if err := s.sampleOne(r.Context(), sb); err != nil {
				continue
			}
		}
		if w := s.history.window(sb.ID, time.Time{}, time.Time{}); len(w) > 0 {
			out[sb.ID] = w[len(w)-1]
		}
	}
	return http.StatusOK, map[string]any{"sandboxes": out}, nil
}
