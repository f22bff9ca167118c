package integration

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
)

// otlpReceiver takes OTLP/HTTP trace exports (protobuf, as OpenTelemetry's
// exporters send them) on loopback and keeps their spans with the
// resource that sent each.
type otlpReceiver struct {
	url string

	mu    sync.Mutex
	spans []receivedSpan
}

type receivedSpan struct {
	service string
	span    *tracepb.Span
}

func newOTLPReceiver(t *testing.T) *otlpReceiver {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	o := &otlpReceiver{url: "http://" + l.Addr().String() + "/v1/traces"}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/traces", func(w http.ResponseWriter, r *http.Request) {
		var body io.Reader = r.Body
		if r.Header.Get("Content-Encoding") == "gzip" {
			zr, err := gzip.NewReader(r.Body)
			if err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			body = zr
		}
		b, err := io.ReadAll(io.LimitReader(body, 16<<20))
		var req coltracepb.ExportTraceServiceRequest
		if err == nil {
			err = proto.Unmarshal(b, &req)
		}
		if err != nil || r.Header.Get("Content-Type") != "application/x-protobuf" {
			http.Error(w, fmt.Sprintf("want an OTLP protobuf export (%s): %v", r.Header.Get("Content-Type"), err), http.StatusBadRequest)
			return
		}
		o.mu.Lock()
		for _, rs := range req.ResourceSpans {
			service := attrString(rs.GetResource().GetAttributes(), "service.name")
			for _, ss := range rs.ScopeSpans {
				for _, sp := range ss.Spans {
					o.spans = append(o.spans, receivedSpan{service, sp})
				}
			}
		}
		o.mu.Unlock()
		out, _ := proto.Marshal(&coltracepb.ExportTraceServiceResponse{})
		w.Header().Set("Content-Type", "application/x-protobuf")
		w.Write(out)
	})
	hs := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go hs.Serve(l)
	t.Cleanup(func() { hs.Close() })
	return o
}

func (o *otlpReceiver) all() []receivedSpan {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([]receivedSpan(nil), o.spans...)
}

func attrString(attrs []*commonpb.KeyValue, key string) string {
	for _, a := range attrs {
		if a.Key == key {
			switch v := a.Value.Value.(type) {
			case *commonpb.AnyValue_StringValue:
				return v.StringValue
			case *commonpb.AnyValue_IntValue:
				return fmt.Sprint(v.IntValue)
			case *commonpb.AnyValue_BoolValue:
				return fmt.Sprint(v.BoolValue)
			}
		}
	}
	return ""
}

// `hutch serve --otlp-endpoint` sends the spans of one sandbox's life
// through the E2B SDK to an OTLP collector: the create's request span with
// the create inside it, and the commands.run's request span with its
// command's span (the program, its exit code) inside it, all naming the
// sandbox; no span holds the API key or the command's text.
func TestServeTracing(t *testing.T) {
	requiresRoot(t)
	requireSDK(t)
	base := baseArchive(t)
	rcv := newOTLPReceiver(t)
	s := newServer(t, base)
	s.flags = []string{"--otlp-endpoint", rcv.url}
	key := s.tenantAdd("traced")
	s.serve()
	kept := s.runScript(t, "trace.mjs", key, nil, 3*time.Minute)
	var run struct {
		SandboxID string `json:"sandboxId"`
	}
	if err := json.Unmarshal([]byte(kept), &run); err != nil || run.SandboxID == "" {
		t.Fatalf("trace.mjs kept %q: %v", kept, err)
	}
	// A stop sends what the batch holds.
	s.stop()

	spans := rcv.all()
	var dump strings.Builder
	for _, rs := range spans {
		sp := rs.span
		fmt.Fprintf(&dump, "  %s %q kind %v parent %x sandbox %q\n", rs.service, sp.Name, sp.Kind, sp.ParentSpanId, attrString(sp.Attributes, "hutch.sandbox.id"))
		if rs.service != "hutch-serve" {
			t.Errorf("span %q from service %q, want hutch-serve", sp.Name, rs.service)
		}
		text := spanText(sp)
		for _, secret := range []string{key, "traced-output"} {
			if strings.Contains(text, secret) {
				t.Errorf("span %q holds %q:\n%s", sp.Name, secret, text)
			}
		}
	}
	find := func(name string, kind tracepb.Span_SpanKind, attrs map[string]string) *tracepb.Span {
		t.Helper()
	next:
		for _, rs := range spans {
			sp := rs.span
			if sp.Name != name || sp.Kind != kind {
				continue
			}
			for k, v := range attrs {
				if attrString(sp.Attributes, k) != v {
					continue next
				}
			}
			return sp
		}
		t.Fatalf("no %v span %q with %v among the %d exported:\n%s", kind, name, attrs, len(spans), dump.String())
		return nil
	}
	childOf := func(child, parent *tracepb.Span) {
		t.Helper()
		if !bytes.Equal(child.TraceId, parent.TraceId) || !bytes.Equal(child.ParentSpanId, parent.SpanId) {
			t.Errorf("span %q (trace %x, parent %x) is not inside %q (trace %x, span %x)", child.Name, child.TraceId, child.ParentSpanId, parent.Name, parent.TraceId, parent.SpanId)
		}
		if child.StartTimeUnixNano < parent.StartTimeUnixNano {
			t.Errorf("span %q starts before %q", child.Name, parent.Name)
		}
	}
	server := tracepb.Span_SPAN_KIND_SERVER
	internal := tracepb.Span_SPAN_KIND_INTERNAL

	createReq := find("POST /v2/sandboxes", server, map[string]string{"http.response.status_code": "201", "hutch.plane": "api"})
	create := find("sandbox.create", internal, map[string]string{"hutch.sandbox.id": run.SandboxID, "hutch.template": "base", "hutch.tenant": "traced"})
	childOf(create, createReq)

	startReq := find("POST /process.Process/Start", server, map[string]string{"hutch.sandbox.id": run.SandboxID, "hutch.plane": "sandbox", "hutch.sandbox.port": "49983"})
	cmd := find("process", internal, map[string]string{"hutch.sandbox.id": run.SandboxID, "hutch.process.command": "/bin/bash", "hutch.process.exit_code": "3"})
	childOf(cmd, startReq)
	if attrString(cmd.Attributes, "hutch.process.pid") == "" || cmd.EndTimeUnixNano <= cmd.StartTimeUnixNano {
		t.Errorf("the command's span has no pid or no duration: %s", spanText(cmd))
	}

	find("DELETE /sandboxes/{id}", server, map[string]string{"http.response.status_code": "204", "hutch.plane": "api", "hutch.sandbox.id": run.SandboxID})
}

// spanText is a span as text, to search and to show.
func spanText(sp *tracepb.Span) string { return protojson.Format(sp) }
