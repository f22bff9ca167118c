package serve

import (
	"context"
	"net/http"
	"strconv"
	"strings"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

// Tracing. With Config.Tracer set, each request is a server span (named
// by its plane and route, its parent the caller's W3C traceparent if it
// sent one), and a create and each command are spans within it: what a
// commands.run costs is the request's span and its command's, from start
// to exit. Spans carry sandbox IDs, templates, routes, statuses and exit
// codes; never a header, a body, a token, a command's arguments or a
// proxied path.

const tracerName = "hutch.dev/hutch/serve"

// Attribute keys of hutch's own.
const (
	attrSandbox  = attribute.Key("hutch.sandbox.id")
	attrPort     = attribute.Key("hutch.sandbox.port")
	attrPlane    = attribute.Key("hutch.plane")
	attrTemplate = attribute.Key("hutch.template")
	attrTenant   = attribute.Key("hutch.tenant")
	attrCommand  = attribute.Key("hutch.process.command")
	attrPID      = attribute.Key("hutch.process.pid")
	attrExitCode = attribute.Key("hutch.process.exit_code")
)

// tracerOf is tp's tracer for serve, a no-op one for nil.
func tracerOf(tp trace.TracerProvider) trace.Tracer {
	if tp == nil {
		tp = noop.NewTracerProvider()
	}
	return tp.Tracer(tracerName)
}

// startRequestSpan starts the server span of r, under the caller's trace
// if r carries one.
// Without a tracer it reads nothing of r and returns r's own context.
func (s *Server) startRequestSpan(r *http.Request) (context.Context, trace.Span) {
	if s.cfg.Tracer == nil {
		return r.Context(), trace.SpanFromContext(r.Context())
	}
	ctx := propagation.TraceContext{}.Extract(r.Context(), propagation.HeaderCarrier(r.Header))
	return s.tracer.Start(ctx, r.Method, trace.WithSpanKind(trace.SpanKindServer),
		trace.WithAttributes(attribute.String("http.request.method", r.Method)))
}

// endRequestSpan names and ends the span of a request r answered with
// status: the API's route pattern, envd's RPC path, or the port of a
// preview (whose path is the sandbox's business).
func endRequestSpan(span trace.Span, r *http.Request, plane, sandbox string, port, status int) {
	name := r.Method
	switch {
	case plane == "api" && r.Pattern != "":
		route := r.Pattern
		if _, path, ok := strings.Cut(route, " "); ok {
			route = path
		}
		name += " " + route
		span.SetAttributes(attribute.String("http.route", route))
		if id := r.PathValue("id"); id != "" && (strings.HasPrefix(route, "/sandboxes/") || strings.HasPrefix(route, "/v2/sandboxes/")) {
			sandbox = id
		}
	case plane == "sandbox" && port == EnvdPort:
		name += " " + r.URL.Path
		span.SetAttributes(attribute.String("url.path", r.URL.Path))
	case plane == "sandbox":
		name += " port " + strconv.Itoa(port)
	}
	span.SetName(name)
	span.SetAttributes(attrPlane.String(plane), attribute.Int("http.response.status_code", status))
	if sandbox != "" {
		span.SetAttributes(attrSandbox.String(sandbox))
	}
	if port > 0 {
		span.SetAttributes(attrPort.Int(port))
	}
	if status >= 500 {
		span.SetStatus(codes.Error, http.StatusText(status))
	}
	span.End()
}

// endSpan ends span, marking it failed with err if there is one.
func endSpan(span trace.Span, err error) {
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}
