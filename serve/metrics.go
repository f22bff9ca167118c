package serve

import (
	"context"
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"hutch.dev/hutch/serve/placement"
)

// metrics are the server's Prometheus metrics, in a registry of its own.
type metrics struct {
	reg       *prometheus.Registry
	requests  *prometheus.HistogramVec
	creates   *prometheus.HistogramVec
	resumes   *prometheus.HistogramVec
	sandboxes func(ctx context.Context) (map[[2]string]int, error)
}

func newMetrics() *metrics {
	m := &metrics{reg: prometheus.NewRegistry()}
	m.requests = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "hutch_serve_request_duration_seconds", Help: "Time to answer an HTTP request, by plane (api or sandbox), method and status code.",
		Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16),
	}, []string{"plane", "method", "code"})
	m.creates = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "hutch_serve_create_duration_seconds", Help: "Time to create a sandbox, by tenant.",
		Buckets: prometheus.ExponentialBuckets(0.025, 2, 12),
	}, []string{"tenant"})
	m.resumes = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "hutch_serve_resume_duration_seconds", Help: "Time to resume a paused sandbox, by tenant.",
		Buckets: prometheus.ExponentialBuckets(0.025, 2, 12),
	}, []string{"tenant"})
	m.reg.MustRegister(m.requests, m.creates, m.resumes, sandboxCollector{m},
		prometheus.NewGoCollector(), prometheus.NewProcessCollector(prometheus.ProcessCollectorOpts{}))
	return m
}

func (m *metrics) observe(plane, method string, code int, d time.Duration) {
	m.requests.WithLabelValues(plane, method, strconv.Itoa(code)).Observe(d.Seconds())
}

func (m *metrics) created(tenant string, d time.Duration) {
	m.creates.WithLabelValues(tenant).Observe(d.Seconds())
}

func (m *metrics) resumed(tenant string, d time.Duration) {
	m.resumes.WithLabelValues(tenant).Observe(d.Seconds())
}

func (m *metrics) handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{})
}

var sandboxesDesc = prometheus.NewDesc("hutch_serve_sandboxes", "Sandboxes of the server, by tenant and state.", []string{"tenant", "state"}, nil)

// sandboxCollector counts the sandboxes when scraped: the placement's
// records are the truth, whichever process changed them.
type sandboxCollector struct{ m *metrics }

func (c sandboxCollector) Describe(ch chan<- *prometheus.Desc) { ch <- sandboxesDesc }

func (c sandboxCollector) Collect(ch chan<- prometheus.Metric) {
	if c.m.sandboxes == nil {
		return
	}
	counts, err := c.m.sandboxes(context.Background())
	if err != nil {
		ch <- prometheus.NewInvalidMetric(sandboxesDesc, err)
		return
	}
	for k, n := range counts {
		ch <- prometheus.MustNewConstMetric(sandboxesDesc, prometheus.GaugeValue, float64(n), k[0], k[1])
	}
}

// countSandboxes counts the server's sandboxes by tenant and state.
func (s *Server) countSandboxes(ctx context.Context) (map[[2]string]int, error) {
	all, err := s.place.List(ctx, "")
	if err != nil {
		return nil, err
	}
	out := map[[2]string]int{}
	for _, sb := range all {
		t := sb.Labels[placement.LabelTenant]
		if t == "" {
			continue
		}
		out[[2]string{t, sb.State}]++
	}
	return out, nil
}

// MetricsHandler is GET /metrics without a key, for a listener of its own
// (hutch serve --metrics-listen): it names every tenant.
func (s *Server) MetricsHandler() http.Handler { return s.metrics.handler() }
