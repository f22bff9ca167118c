package serve

import (
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/containerd/errdefs"

	"hutch.dev/hutch/engine"
)

func (s *Server) sandboxMetrics(r *http.Request, tenantName string) (int, any, error) {
	sb, err := s.owned(r.Context(), tenantName, r.PathValue("id"))
	if err != nil {
		return 0, nil, err
	}
	if sb.State != engine.StateRunning {
		return http.StatusOK, []any{}, nil
	}
	st, err := s.place.Stats(r.Context(), sb.ID)
	if err != nil {
		return 0, nil, err
	}
	now := time.Now().UTC()
	type metric struct {
		Timestamp     time.Time `json:"timestamp"`
		TimestampUnix int64     `json:"timestampUnix"`
		CPUCount      int       `json:"cpuCount"`
		CPUUsedPct    float64   `json:"cpuUsedPct"`
		MemUsed       int64     `json:"memUsed"`
		MemTotal      int64     `json:"memTotal"`
		DiskUsed      int64     `json:"diskUsed"`
		DiskTotal     int64     `json:"diskTotal"`
	}
	return http.StatusOK, []metric{{
		Timestamp: now, TimestampUnix: now.Unix(), CPUCount: max(1, int(sb.CPUs+0.5)),
		CPUUsedPct: st.CPU.Percent, MemUsed: int64(st.Memory.Usage), MemTotal: sb.Memory,
		DiskUsed: int64(st.Disk.Used), DiskTotal: sb.Disk,
	}}, nil
}

func (s *Server) sandboxLogs(r *http.Request, tenantName string) (int, any, error) {
	sb, err := s.owned(r.Context(), tenantName, r.PathValue("id"))
	if err != nil {
		return 0, nil, err
	}
	limit := 1000
	if v := r.URL.Query().Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 10000 {
			return 0, nil, fmt.Errorf("limit %q: want 1 to 10000: %w", v, errdefs.ErrInvalidArgument)
		}
		limit = n
	}
	var buf strings.Builder
	lw := &limitedWriter{w: &buf, n: 8 << 20}
	if err := s.place.Logs(r.Context(), sb.ID, lw); err != nil {
		return 0, nil, err
	}
	type logLine struct {
		Timestamp time.Time `json:"timestamp"`
		Line      string    `json:"line"`
	}
	lines := strings.Split(strings.TrimRight(buf.String(), "\n"), "\n")
	if len(lines) > limit {
		lines = lines[len(lines)-limit:]
	}
	logs := []logLine{}
	for _, l := range lines {
		if l == "" {
			continue
		}
		ts, rest, _ := strings.Cut(l, " ")
		t, err := time.Parse(time.RFC3339Nano, ts)
		if err != nil {
			t, rest = time.Time{}, l
		}
		logs = append(logs, logLine{Timestamp: t, Line: rest})
	}
	return http.StatusOK, map[string]any{"logs": logs, "logEntries": []any{}}, nil
}

// limitedWriter keeps the first n bytes written to it and drops the rest.
type limitedWriter struct {
	w io.Writer
	n int64
}

func (l *limitedWriter) Write(p []byte) (int, error) {
	if l.n <= 0 {
		return len(p), nil
	}
	q := p
	if int64(len(q)) > l.n {
		q = q[:l.n]
	}
	n, err := l.w.Write(q)
	l.n -= int64(n)
	if err != nil {
		return n, err
	}
	return len(p), nil
}
