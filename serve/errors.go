package serve

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"net/http"
	"strings"

	"connectrpc.com/connect"
	"github.com/containerd/errdefs"
)

// httpStatus maps an error wrapping an errdefs sentinel to the HTTP status
// E2B's API answers with.
func httpStatus(err error) int {
	var ume *unsupportedMediaError
	var mbe *http.MaxBytesError
	switch {
	case errors.Is(err, errGone):
		return http.StatusGone
	case errors.As(err, &ume):
		return http.StatusUnsupportedMediaType
	case errors.As(err, &mbe):
		return http.StatusRequestEntityTooLarge
	case errors.Is(err, errdefs.ErrNotFound):
		return http.StatusNotFound
	case errors.Is(err, errdefs.ErrInvalidArgument):
		return http.StatusBadRequest
	case errors.Is(err, errdefs.ErrAlreadyExists), errors.Is(err, errdefs.ErrConflict):
		return http.StatusConflict
	case errors.Is(err, errdefs.ErrPermissionDenied):
		return http.StatusForbidden
	case errors.Is(err, errdefs.ErrUnauthenticated):
		return http.StatusUnauthorized
	case errors.Is(err, errdefs.ErrFailedPrecondition):
		return http.StatusConflict
	case errors.Is(err, errdefs.ErrNotImplemented):
		return http.StatusNotImplemented
	case errors.Is(err, errdefs.ErrResourceExhausted):
		return http.StatusTooManyRequests
	case errors.Is(err, errdefs.ErrUnavailable):
		return http.StatusServiceUnavailable
	}
	return http.StatusInternalServerError
}

// errGone is a call E2B retired: 410.
var errGone = errors.New("gone")

// apiError is E2B's REST error body.
type apiError struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
}

// writeError answers an HTTP request with E2B's error shape.
func writeError(w http.ResponseWriter, status int, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(apiError{Code: status, Message: msg}) //nolint:errcheck // the client went away
}

// writeErr answers with err's status and message.
func writeErr(w http.ResponseWriter, err error) {
	writeError(w, httpStatus(err), message(err))
}

// sentinels are the errdefs errors whose text message leaves out: the
// status already says it.
var sentinels = []error{
	errdefs.ErrNotFound, errdefs.ErrInvalidArgument, errdefs.ErrAlreadyExists,
	errdefs.ErrConflict, errdefs.ErrPermissionDenied, errdefs.ErrUnauthenticated,
	errdefs.ErrFailedPrecondition, errdefs.ErrNotImplemented,
	errdefs.ErrResourceExhausted, errdefs.ErrUnavailable, errdefs.ErrUnknown,
}

// message is err's text for a client, without the sentinel's name that
// wrapping appends ("...: not found").
func message(err error) string {
	msg := err.Error()
	for again := true; again; {
		again = false
		for _, s := range sentinels {
			if t, ok := strings.CutSuffix(msg, ": "+s.Error()); ok {
				msg, again = t, true
			}
		}
	}
	return msg
}

// connectError maps an error wrapping an errdefs sentinel to the Connect
// code envd answers with.
func connectError(err error) error {
	if err == nil {
		return nil
	}
	var ce *connect.Error
	if errors.As(err, &ce) {
		return err
	}
	code := connect.CodeInternal
	switch {
	case errors.Is(err, errdefs.ErrNotFound):
		code = connect.CodeNotFound
	case errors.Is(err, errdefs.ErrInvalidArgument):
		code = connect.CodeInvalidArgument
	case errors.Is(err, errdefs.ErrAlreadyExists):
		code = connect.CodeAlreadyExists
	case errors.Is(err, errdefs.ErrPermissionDenied):
		code = connect.CodePermissionDenied
	case errors.Is(err, errdefs.ErrUnauthenticated):
		code = connect.CodeUnauthenticated
	case errors.Is(err, errdefs.ErrFailedPrecondition):
		code = connect.CodeFailedPrecondition
	case errors.Is(err, errdefs.ErrNotImplemented):
		code = connect.CodeUnimplemented
	case errors.Is(err, errdefs.ErrResourceExhausted):
		code = connect.CodeResourceExhausted
	case errors.Is(err, errdefs.ErrUnavailable):
		code = connect.CodeUnavailable
	case errors.Is(err, context.DeadlineExceeded):
		code = connect.CodeDeadlineExceeded
	case errors.Is(err, context.Canceled):
		code = connect.CodeCanceled
	}
	return connect.NewError(code, errors.New(message(err)))
}

// isRPC tells whether r is a call of one of envd's Connect services.
func isRPC(r *http.Request) bool {
	return strings.HasPrefix(r.URL.Path, "/process.Process/") || strings.HasPrefix(r.URL.Path, "/filesystem.Filesystem/")
}

// writeSandboxError answers a data-plane request that cannot reach its
// sandbox: in the Connect protocol for envd's services, so that SDKs see
// the code (not_found, unavailable, ...), else in E2B's REST shape.
func writeSandboxError(w http.ResponseWriter, r *http.Request, err error) {
	if !isRPC(r) {
		writeErr(w, err)
		return
	}
	ce := connectError(err).(*connect.Error)
	body := map[string]string{"code": ce.Code().String(), "message": ce.Message()}
	if strings.HasPrefix(r.Header.Get("Content-Type"), "application/connect+") {
		// A streaming call: the error ends the stream, in an envelope
		// flagged end-of-stream (0x02), with HTTP 200.
		b, _ := json.Marshal(map[string]any{"error": body})
		w.Header().Set("Content-Type", r.Header.Get("Content-Type"))
		w.WriteHeader(http.StatusOK)
		hdr := []byte{0x02, 0, 0, 0, 0}
		binary.BigEndian.PutUint32(hdr[1:], uint32(len(b)))
		w.Write(append(hdr, b...)) //nolint:errcheck // the client went away
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(httpStatus(err))
	json.NewEncoder(w).Encode(body) //nolint:errcheck // the client went away
}

// goneJSON is the body E2B's proxy answers for a sandbox it cannot
// reach: killed, expired, paused without auto-resume, or never there.
type goneJSON struct {
	SandboxID string `json:"sandboxId"`
	Message   string `json:"message"`
	Code      int    `json:"code"`
}

// writeGone answers a data-plane request whose sandbox is not there, or
// whose token is not its own, as E2B does: 502 with E2B's body, for
// envd's REST paths, its Connect services and port previews alike. The
// SDKs read it as a sandbox that is no longer running (isRunning false,
// "the sandbox was killed or reached its end of life"). Nothing in it
// depends on whether the sandbox exists.
func writeGone(w http.ResponseWriter, id string) {
	b, _ := json.Marshal(goneJSON{SandboxID: id, Message: "The sandbox was not found", Code: http.StatusBadGateway})
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.WriteHeader(http.StatusBadGateway)
	w.Write(b) //nolint:errcheck // the client went away
}

// abortWriter aborts its request's response once the request's context
// ends for errSandboxGone: the sandbox was killed while it was answered.
// The connection is dropped (net/http resets it, HTTP/2 sends
// RST_STREAM) rather than the answer ended well, as E2B's proxy drops
// the connections of a sandbox that is gone.
type abortWriter struct {
	http.ResponseWriter
	ctx context.Context
}

func (w abortWriter) check() {
	if errors.Is(context.Cause(w.ctx), errSandboxGone) {
		panic(http.ErrAbortHandler)
	}
}

func (w abortWriter) WriteHeader(code int) {
	w.check()
	w.ResponseWriter.WriteHeader(code)
}

func (w abortWriter) Write(p []byte) (int, error) {
	w.check()
	return w.ResponseWriter.Write(p)
}

func (w abortWriter) Flush() {
	w.check()
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// Unwrap lets http.ResponseController reach the connection.
func (w abortWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
