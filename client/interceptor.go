package client

import (
	"context"
	"encoding/base64"
	"net/http"

	"connectrpc.com/connect"
)

func base64Std(s string) string { return base64.StdEncoding.EncodeToString([]byte(s)) }

// headerInterceptor sets headers on every unary and streaming call.
type headerInterceptor func(http.Header)

func (f headerInterceptor) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		f(req.Header())
		return next(ctx, req)
	}
}

func (f headerInterceptor) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return func(ctx context.Context, spec connect.Spec) connect.StreamingClientConn {
		conn := next(ctx, spec)
		f(conn.RequestHeader())
		return conn
	}
}

func (f headerInterceptor) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return next
}
