package serve

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/containerd/errdefs"

	"hutch.dev/hutch/engine"
	"hutch.dev/hutch/screen"
)

// recordTimeout bounds a recording's start or stop.
const recordTimeout = 30 * time.Second

// startRecording is POST /sandboxes/{id}/recordings, hutch's own call:
// it starts recording a desktop sandbox's screen (ffmpeg, H.264 in MP4,
// "fps" frames a second, default 10) and answers 201 with the
// recording's ID and the file in the sandbox it is written to.
func (s *Server) startRecording(r *http.Request, tenantName string) (int, any, error) {
	var body struct {
		FPS int `json:"fps"`
	}
	if err := decodeBody(r, &body); err != nil {
		return 0, nil, err
	}
	if body.FPS == 0 {
		body.FPS = 10
	}
	if body.FPS < 1 || body.FPS > 30 {
		return 0, nil, fmt.Errorf("fps %d: want 1 to 30 frames a second: %w", body.FPS, errdefs.ErrInvalidArgument)
	}
	sb, err := s.runningOwned(r, tenantName)
	if err != nil {
		return 0, nil, err
	}
	rec := screen.NewID()
	size, err := s.runScreen(r.Context(), sb, screen.StartCommand(rec, body.FPS))
	if err != nil {
		return 0, nil, err
	}
	s.log.Info("recording started", "sandbox", sb.ID, "tenant", tenantName, "recording", rec)
	return http.StatusCreated, map[string]any{
		"recordingID": rec, "sandboxID": sb.ID, "path": screen.File(rec), "fps": body.FPS, "size": size,
	}, nil
}

// stopRecording is POST /sandboxes/{id}/recordings/{recordingID}/stop:
// ffmpeg finishes the file, which the caller then reads like any other
// (GET /files?path=PATH on envd, the SDK's files.read).
func (s *Server) stopRecording(r *http.Request, tenantName string) (int, any, error) {
	var body struct{}
	if err := decodeBody(r, &body); err != nil {
		return 0, nil, err
	}
	rec := r.PathValue("recordingID")
	if err := screen.CheckID(rec); err != nil {
		return 0, nil, err
	}
	sb, err := s.runningOwned(r, tenantName)
	if err != nil {
		return 0, nil, err
	}
	out, err := s.runScreen(r.Context(), sb, screen.StopCommand(rec))
	if err != nil {
		return 0, nil, err
	}
	n, _ := strconv.ParseInt(out, 10, 64)
	s.log.Info("recording stopped", "sandbox", sb.ID, "tenant", tenantName, "recording", rec, "bytes", n)
	return http.StatusOK, map[string]any{"recordingID": rec, "sandboxID": sb.ID, "path": screen.File(rec), "bytes": n}, nil
}

// runningOwned is the running sandbox {id} of tenant.
func (s *Server) runningOwned(r *http.Request, tenantName string) (*engine.Sandbox, error) {
	sb, err := s.owned(r.Context(), tenantName, r.PathValue("id"))
	if err != nil {
		return nil, err
	}
	if sb.State != engine.StateRunning {
		return nil, fmt.Errorf("sandbox %s is %s, not running: %w", sb.ID, sb.State, errdefs.ErrConflict)
	}
	return sb, nil
}

// runScreen runs one of package screen's commands in sb and returns its
// output: exit 3 is a recording that is not there, any other failure
// the command's own message.
func (s *Server) runScreen(ctx context.Context, sb *engine.Sandbox, args []string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, recordTimeout)
	defer cancel()
	var out, errb bytes.Buffer
	cmd, err := s.place.Processes().Start(ctx, sb.ID, engine.ExecRequest{Args: args, Stdout: &out, Stderr: &errb})
	if err != nil {
		return "", err
	}
	code, err := cmd.Wait()
	msg := strings.TrimSpace(errb.String())
	switch {
	case err != nil:
		return "", err
	case code == 3:
		return "", fmt.Errorf("sandbox %s: %s: %w", sb.ID, msg, errdefs.ErrNotFound)
	case code == 127 || strings.Contains(msg, "desktop image"):
		return "", fmt.Errorf("sandbox %s: %s: %w", sb.ID, msg, errdefs.ErrFailedPrecondition)
	case code != 0:
		return "", fmt.Errorf("sandbox %s: %s", sb.ID, msg)
	}
	return strings.TrimSpace(out.String()), nil
}
