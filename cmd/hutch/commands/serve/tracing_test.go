package serve

import (
	"context"
	"io"
	"log/slog"
	"strings"
	"testing"
)

// TestTracingEndpoint checks that tracing is off unless configured and
// that an endpoint that is not an OTLP/HTTP URL is refused, naming it.
func TestTracingEndpoint(t *testing.T) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	for _, v := range otlpEnv {
		t.Setenv(v, "")
	}
	tp, end, err := tracing(context.Background(), "", "--otlp-endpoint", "v", log)
	if err != nil || tp != nil {
		t.Fatalf("without an endpoint: tracer %v, error %v; want none", tp, err)
	}
	end()
	for _, bad := range []string{"127.0.0.1:4318", "ftp://collector/v1/traces", "http://", "::"} {
		_, _, err := tracing(context.Background(), bad, "--otlp-endpoint", "v", log)
		if err == nil || !strings.Contains(err.Error(), "--otlp-endpoint") || !strings.Contains(err.Error(), "OTLP/HTTP URL") {
			t.Errorf("endpoint %q: error %v; want one naming the flag", bad, err)
		}
	}
	tp, end, err = tracing(context.Background(), "http://127.0.0.1:1", "--otlp-endpoint", "v", log)
	if err != nil || tp == nil {
		t.Fatalf("with an endpoint: tracer %v, error %v", tp, err)
	}
	end()
}
