package serve

import (
	"context"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// otlpEnv are OpenTelemetry's own variables that name where traces go;
// either turns tracing on as --otlp-endpoint does.
var otlpEnv = []string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT"}

// tracing makes the tracer provider of --otlp-endpoint (or of
// OpenTelemetry's environment): spans batched and sent over OTLP/HTTP.
// It returns nil, and traces nothing, if neither is set. shutdown sends
// what is left.
func tracing(ctx context.Context, endpoint, opt string, version string, log *slog.Logger) (tp *sdktrace.TracerProvider, shutdown func(), err error) {
	var opts []otlptracehttp.Option
	if endpoint != "" {
		u, err := url.Parse(endpoint)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return nil, nil, fmt.Errorf("%s %q: want an OTLP/HTTP URL, e.g. http://127.0.0.1:4318/v1/traces", opt, endpoint)
		}
		if u.Path == "" || u.Path == "/" {
			u.Path = "/v1/traces"
		}
		opts = append(opts, otlptracehttp.WithEndpointURL(u.String()))
	} else {
		set := false
		for _, v := range otlpEnv {
			set = set || os.Getenv(v) != ""
		}
		if !set {
			return nil, func() {}, nil
		}
	}
	exp, err := otlptracehttp.New(ctx, opts...)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", opt, err)
	}
	res := resource.NewSchemaless(
		attribute.String("service.name", "hutch-serve"),
		attribute.String("service.version", version),
	)
	tp = sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
	log.Info("tracing to OTLP", "endpoint", endpoint)
	return tp, func() {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := tp.Shutdown(sctx); err != nil {
			log.Warn("sending the last traces", "err", err)
		}
	}, nil
}
