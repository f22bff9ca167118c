package mcp

import (
	"bytes"
	"context"
	"encoding/base64"
	"fmt"
	"io/fs"
	"path/filepath"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/containerd/errdefs"
	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"hutch.dev/hutch/engine"
)

// --- files -------------------------------------------------------------------

type pathArgs struct {
	sandboxArg
	Path string `json:"path" jsonschema:"absolute path in the sandbox, e.g. /workspace/main.py"`
}

type readArgs struct {
	pathArgs
	MaxBytes int64 `json:"max_bytes,omitempty" jsonschema:"most bytes to return (default 262144, at most 4194304)"`
}

type readResult struct {
	Path      string `json:"path"`
	Content   string `json:"content"`
	Encoding  string `json:"encoding" jsonschema:"utf8, or base64 for a file that is not UTF-8 text"`
	Size      int64  `json:"size" jsonschema:"the file's whole size in bytes"`
	Truncated bool   `json:"truncated,omitempty" jsonschema:"only the first max_bytes bytes are in content"`
}

// checkPath refuses a sandbox path that is not absolute, before any
// sandbox is touched.
func checkPath(name, p string) error {
	if p == "" {
		return fmt.Errorf("%s is empty: want an absolute path in the sandbox: %w", name, errdefs.ErrInvalidArgument)
	}
	if !strings.HasPrefix(p, "/") {
		return fmt.Errorf("%s %q: want an absolute path in the sandbox (starting with /): %w", name, p, errdefs.ErrInvalidArgument)
	}
	return nil
}

// limitWriter keeps the first n bytes written and counts the rest.
type limitWriter struct {
	buf   bytes.Buffer
	n     int64
	total int64
}

func (w *limitWriter) Write(p []byte) (int, error) {
	w.total += int64(len(p))
	if room := w.n - int64(w.buf.Len()); room > 0 {
		w.buf.Write(p[:min(int64(len(p)), room)])
	}
	return len(p), nil
}

func (s *Server) readFile(ctx context.Context, a readArgs) (*sdk.CallToolResult, readResult, error) {
	if err := checkPath("path", a.Path); err != nil {
		return nil, readResult{}, err
	}
	limit := a.MaxBytes
	switch {
	case limit == 0:
		limit = defaultReadBytes
	case limit < 0 || limit > maxReadBytes:
		return nil, readResult{}, fmt.Errorf("max_bytes %d: want 1 to %d: %w", limit, maxReadBytes, errdefs.ErrInvalidArgument)
	}
	if err := checkRef(a.SandboxID); err != nil {
		return nil, readResult{}, err
	}
	w := &limitWriter{n: limit}
	if err := s.be.readFile(ctx, a.SandboxID, a.Path, w); err != nil {
		return nil, readResult{}, err
	}
	data := w.buf.Bytes()
	res := readResult{Path: a.Path, Size: w.total, Truncated: w.total > int64(len(data)), Encoding: "utf8"}
	text := data
	if res.Truncated {
		// A cut may split the last character: that is no reason to
		// call the file binary.
		for i := 0; i < utf8.UTFMax && len(text) > 0 && !utf8.Valid(text); i++ {
			text = text[:len(text)-1]
		}
	}
	if utf8.Valid(text) {
		res.Content = string(text)
	} else {
		res.Encoding, res.Content = "base64", base64.StdEncoding.EncodeToString(data)
	}
	body := res.Content
	if res.Truncated {
		body += fmt.Sprintf("\n[... truncated: showed %d of %d bytes; pass a larger max_bytes, or use run_command with tail or sed to read further ...]", len(data), res.Size)
	}
	if res.Encoding == "base64" {
		body = "(binary file, base64)\n" + body
	}
	return &sdk.CallToolResult{Content: []sdk.Content{&sdk.TextContent{Text: body}}}, res, nil
}

type writeArgs struct {
	pathArgs
	Content  string `json:"content" jsonschema:"the file's new content"`
	Encoding string `json:"encoding,omitempty" jsonschema:"utf8 (default) or base64"`
	Mode     string `json:"mode,omitempty" jsonschema:"octal permissions, e.g. 0755 for a script (default 0644)"`
}

type writeResult struct {
	Path  string `json:"path"`
	Bytes int    `json:"bytes"`
}

// parseMode parses an octal permission string.
func parseMode(m string) (fs.FileMode, error) {
	if m == "" {
		return 0o644, nil
	}
	v, err := strconv.ParseUint(m, 8, 32)
	if err != nil || v > 0o777 || v == 0 {
		return 0, fmt.Errorf("mode %q: want octal permissions such as 0644 or 0755: %w", m, errdefs.ErrInvalidArgument)
	}
	return fs.FileMode(v), nil
}

func (s *Server) writeFile(ctx context.Context, a writeArgs) (*sdk.CallToolResult, writeResult, error) {
	if err := checkPath("path", a.Path); err != nil {
		return nil, writeResult{}, err
	}
	mode, err := parseMode(a.Mode)
	if err != nil {
		return nil, writeResult{}, err
	}
	data := []byte(a.Content)
	switch a.Encoding {
	case "", "utf8":
	case "base64":
		if data, err = base64.StdEncoding.DecodeString(a.Content); err != nil {
			return nil, writeResult{}, fmt.Errorf("content is not valid base64: %w: %w", err, errdefs.ErrInvalidArgument)
		}
	default:
		return nil, writeResult{}, fmt.Errorf("encoding %q: want utf8 or base64: %w", a.Encoding, errdefs.ErrInvalidArgument)
	}
	if err := checkRef(a.SandboxID); err != nil {
		return nil, writeResult{}, err
	}
	if err := s.be.writeFile(ctx, a.SandboxID, a.Path, data, mode); err != nil {
		return nil, writeResult{}, err
	}
	return nil, writeResult{Path: a.Path, Bytes: len(data)}, nil
}

type fileEntry struct {
	Name    string    `json:"name"`
	Type    string    `json:"type" jsonschema:"file, dir, symlink or other"`
	Size    int64     `json:"size"`
	Mode    string    `json:"mode" jsonschema:"permissions in octal"`
	ModTime time.Time `json:"mod_time"`
	Link    string    `json:"link,omitempty" jsonschema:"a symlink's target"`
}

type listResult struct {
	Path    string      `json:"path"`
	Entries []fileEntry `json:"entries"`
}

func entryOf(fi engine.FileInfo) fileEntry {
	e := fileEntry{Name: fi.Name, Size: fi.Size, Mode: fmt.Sprintf("%04o", fi.Mode.Perm()), ModTime: fi.ModTime.UTC(), Link: fi.Link}
	switch {
	case fi.IsDir:
		e.Type = "dir"
	case fi.Mode&fs.ModeSymlink != 0:
		e.Type = "symlink"
	case fi.Mode.IsRegular():
		e.Type = "file"
	default:
		e.Type = "other"
	}
	return e
}

func (s *Server) listFiles(ctx context.Context, a pathArgs) (*sdk.CallToolResult, listResult, error) {
	if err := checkPath("path", a.Path); err != nil {
		return nil, listResult{}, err
	}
	if err := checkRef(a.SandboxID); err != nil {
		return nil, listResult{}, err
	}
	entries, err := s.be.listDir(ctx, a.SandboxID, a.Path)
	if err != nil {
		return nil, listResult{}, err
	}
	return nil, listResult{Path: a.Path, Entries: entries}, nil
}

type removeFileArgs struct {
	pathArgs
	Recursive bool `json:"recursive,omitempty" jsonschema:"also remove a directory's contents"`
}

type done struct {
	OK bool `json:"ok"`
}

func (s *Server) removeFile(ctx context.Context, a removeFileArgs) (*sdk.CallToolResult, done, error) {
	if err := checkPath("path", a.Path); err != nil {
		return nil, done{}, err
	}
	if a.Path == "/" {
		return nil, done{}, fmt.Errorf("refusing to remove /: remove the sandbox instead: %w", errdefs.ErrInvalidArgument)
	}
	if err := checkRef(a.SandboxID); err != nil {
		return nil, done{}, err
	}
	if err := s.be.removeFile(ctx, a.SandboxID, a.Path, a.Recursive); err != nil {
		return nil, done{}, err
	}
	return nil, done{OK: true}, nil
}

// --- host transfers ----------------------------------------------------------

type transferArgs struct {
	sandboxArg
	HostPath string `json:"host_path" jsonschema:"path on the host, inside the allowed host directory (relative paths are taken from it)"`
	Path     string `json:"path" jsonschema:"absolute path in the sandbox"`
}

type transferResult struct {
	HostPath string `json:"host_path" jsonschema:"the host path, resolved"`
	Path     string `json:"path"`
}

func (s *Server) upload(ctx context.Context, a transferArgs) (*sdk.CallToolResult, transferResult, error) {
	if err := checkPath("path", a.Path); err != nil {
		return nil, transferResult{}, err
	}
	if err := checkRef(a.SandboxID); err != nil {
		return nil, transferResult{}, err
	}
	src, shown, err := s.hostDir.openSource(a.HostPath)
	if err != nil {
		return nil, transferResult{}, err
	}
	defer src.Close()
	if err := s.be.upload(ctx, a.SandboxID, src, filepath.Base(shown), a.Path); err != nil {
		return nil, transferResult{}, err
	}
	return nil, transferResult{HostPath: shown, Path: a.Path}, nil
}

func (s *Server) download(ctx context.Context, a transferArgs) (*sdk.CallToolResult, transferResult, error) {
	if err := checkPath("path", a.Path); err != nil {
		return nil, transferResult{}, err
	}
	if err := checkRef(a.SandboxID); err != nil {
		return nil, transferResult{}, err
	}
	dst, err := s.hostDir.openTarget(a.HostPath)
	if err != nil {
		return nil, transferResult{}, err
	}
	defer dst.close()
	if err := s.be.download(ctx, a.SandboxID, a.Path, dst); err != nil {
		return nil, transferResult{}, err
	}
	return nil, transferResult{HostPath: dst.path, Path: a.Path}, nil
}
