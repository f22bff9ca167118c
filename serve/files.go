package serve

import (
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"mime/multipart"
	"net/http"
	"path"
	"strings"

	"github.com/containerd/errdefs"

	"hutch.dev/hutch/agent/wire"
	"hutch.dev/hutch/serve/placement"
)

// uploadedFile is one entry of /files' answer to an upload.
type uploadedFile struct {
	Name     string            `json:"name"`
	Type     string            `json:"type"`
	Path     string            `json:"path"`
	Metadata map[string]string `json:"metadata,omitempty"`
}

// serveFiles is envd's /files over p: GET downloads the file at ?path=,
// POST uploads one (application/octet-stream, the body is the file, gzip
// Content-Encoding allowed) or several (multipart/form-data, parts named
// "file" whose file name is the path unless ?path= is given). Paths are
// resolved for ?username= (or the request's user), as whom p acts;
// uploads create missing parent directories. Both directions stream:
// nothing is held in memory whole.
func serveFiles(p placement.Placement) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		switch r.Method {
		case http.MethodGet, http.MethodHead:
		case http.MethodPost:
		default:
			w.Header().Set("Allow", "GET, HEAD, POST")
			writeError(w, http.StatusMethodNotAllowed, fmt.Sprintf("method %s is not allowed on /files", r.Method))
			return
		}
		t := targetOf(r.Context())
		f, err := p.Files(r.Context(), t.SandboxID, placement.FileUser{Named: r.URL.Query().Get("username"), Default: requestUser(r.Header)})
		if err != nil {
			writeErr(w, err)
			return
		}
		if r.Method == http.MethodPost {
			upload(w, r, f)
			return
		}
		download(w, r, f, t.SandboxID)
	}
}

// resolveFor resolves a request's path for f's user: a relative one
// against the user's home, looked up only then.
func resolveFor(ctx context.Context, f placement.Files, raw string) (string, error) {
	if path.IsAbs(raw) {
		return resolvePath(raw, "/")
	}
	home, err := f.Home(ctx)
	if err != nil {
		return "", err
	}
	return resolvePath(raw, home)
}

// download streams the file at ?path= to the client.
func download(w http.ResponseWriter, r *http.Request, f placement.Files, sandboxID string) {
	raw := r.URL.Query().Get("path")
	if raw == "" {
		writeError(w, http.StatusBadRequest, "path is required to download a file")
		return
	}
	p, err := resolveFor(r.Context(), f, raw)
	if err != nil {
		writeErr(w, err)
		return
	}
	out := &lazyWriter{w: w, start: func(h http.Header) {
		h.Set("Content-Type", "application/octet-stream")
		if f.NamesDownloads() {
			h.Set("Content-Disposition", mime.FormatMediaType("inline", map[string]string{"filename": path.Base(p)}))
		}
	}}
	var dst io.Writer = out
	if r.Method == http.MethodHead {
		dst = io.Discard
	}
	err = f.Read(r.Context(), p, dst)
	switch {
	case err != nil && !out.started:
		if errors.Is(err, errdefs.ErrNotFound) {
			err = fmt.Errorf("file %s not found: %w", p, err)
		}
		writeErr(w, err)
	case err != nil:
		// Part of the file is out with a 200: the client must see a
		// broken transfer, not a short file.
		slog.WarnContext(r.Context(), "download failed midway", "sandbox", sandboxID, "path", p, "error", err)
		panic(http.ErrAbortHandler)
	case !out.started:
		out.begin()
	}
}

// lazyWriter sends the response's headers with its first byte, so that an
// error before any byte can still be answered with an error status.
type lazyWriter struct {
	w       http.ResponseWriter
	start   func(http.Header)
	started bool
}

func (l *lazyWriter) begin() {
	l.started = true
	l.start(l.w.Header())
	l.w.WriteHeader(http.StatusOK)
}

func (l *lazyWriter) Write(p []byte) (int, error) {
	if !l.started {
		l.begin()
	}
	return l.w.Write(p)
}

// upload writes the request's file or files as f's user.
func upload(w http.ResponseWriter, r *http.Request, f placement.Files) {
	meta, err := uploadMetadata(r.Header)
	if err != nil {
		writeErr(w, err)
		return
	}
	uploadWith(w, r, func(raw string, data io.Reader) (uploadedFile, error) {
		p, err := resolveFor(r.Context(), f, raw)
		if err != nil {
			return uploadedFile{}, err
		}
		if p == "/" {
			return uploadedFile{}, fmt.Errorf("path %q: is the root directory: %w", raw, errdefs.ErrInvalidArgument)
		}
		kept, err := f.Write(r.Context(), p, data, meta)
		if err != nil {
			return uploadedFile{}, err
		}
		return uploadedFile{Name: path.Base(p), Type: "file", Path: p, Metadata: kept}, nil
	})
}

// metadataHeader prefixes the request headers that give an upload's file
// metadata, one header a key.
const metadataHeader = "X-Metadata-"

// uploadMetadata is the file metadata an upload gives (X-Metadata-KEY:
// VALUE headers, keys in lower case as E2B's envd keeps them), nil if
// none. A key or value that cannot be kept is an error naming it.
func uploadMetadata(h http.Header) (map[string]string, error) {
	var meta map[string]string
	size := 0
	for name, values := range h {
		key, ok := strings.CutPrefix(name, metadataHeader)
		if !ok || len(values) == 0 {
			continue
		}
		key = strings.ToLower(key)
		if err := checkMetadata(key, values[0]); err != nil {
			return nil, err
		}
		if meta == nil {
			meta = map[string]string{}
		}
		meta[key] = values[0]
		size += len(key) + len(values[0])
	}
	if size > maxMetadataSize {
		return nil, fmt.Errorf("invalid metadata: %d bytes of keys and values, more than %d: %w", size, maxMetadataSize, errdefs.ErrInvalidArgument)
	}
	return meta, nil
}

// maxMetadataKey and maxMetadataSize bound a file's metadata: a key is
// an extended attribute's name after its prefix (255 bytes in all), and
// all of a file's attributes share one block on most file systems.
const (
	maxMetadataKey  = 255 - len(wire.MetadataXattr)
	maxMetadataSize = 4000
)

// checkMetadata refuses a metadata key that is not an HTTP token or is
// too long, and a value that is not printable US-ASCII.
func checkMetadata(key, value string) error {
	if key == "" || len(key) > maxMetadataKey {
		return fmt.Errorf("invalid metadata: key %q: want 1 to %d characters: %w", key, maxMetadataKey, errdefs.ErrInvalidArgument)
	}
	for _, c := range key {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || strings.ContainsRune("!#$%&'*+-.^_`|~", c)) {
			return fmt.Errorf("invalid metadata: key %q: %q is not a letter, digit or one of !#$%%&'*+-.^_`|~: %w", key, c, errdefs.ErrInvalidArgument)
		}
	}
	for _, c := range value {
		if c < 0x20 || c > 0x7e {
			return fmt.Errorf("invalid metadata: the value of %q has %q, not printable US-ASCII: %w", key, c, errdefs.ErrInvalidArgument)
		}
	}
	return nil
}

// fileWriter writes data to the file raw names in the request's sandbox.
type fileWriter func(raw string, data io.Reader) (uploadedFile, error)

// uploadWith writes the request's file or files with write.
func uploadWith(w http.ResponseWriter, r *http.Request, write fileWriter) {
	query := r.URL.Query().Get("path")
	ct, params, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if err != nil && r.Header.Get("Content-Type") != "" {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("Content-Type %q: %v", r.Header.Get("Content-Type"), err))
		return
	}
	var written []uploadedFile
	if ct == "multipart/form-data" {
		written, err = uploadMultipart(r, write, query, params["boundary"])
	} else {
		var f uploadedFile
		f, err = uploadBody(r, write, query)
		written = []uploadedFile{f}
	}
	if err != nil {
		writeErr(w, err)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(written) //nolint:errcheck // the client went away
}

// uploadBody writes the request's body, the file itself, to ?path=.
func uploadBody(r *http.Request, write fileWriter, query string) (uploadedFile, error) {
	if query == "" {
		return uploadedFile{}, fmt.Errorf("path is required to upload a file as %s: %w", r.Header.Get("Content-Type"), errdefs.ErrInvalidArgument)
	}
	var body io.Reader = r.Body
	switch enc := strings.ToLower(strings.TrimSpace(r.Header.Get("Content-Encoding"))); enc {
	case "", "identity":
	case "gzip":
		zr, err := gzip.NewReader(r.Body)
		if err != nil {
			return uploadedFile{}, fmt.Errorf("gzip body: %v: %w", err, errdefs.ErrInvalidArgument)
		}
		defer zr.Close()
		body = zr
	default:
		return uploadedFile{}, fmt.Errorf("content encoding %q: only gzip is supported: %w", enc, errdefs.ErrInvalidArgument)
	}
	return write(query, body)
}

// uploadMultipart writes each part named "file".
func uploadMultipart(r *http.Request, write fileWriter, query, boundary string) ([]uploadedFile, error) {
	if boundary == "" {
		return nil, fmt.Errorf("multipart/form-data without a boundary: %w", errdefs.ErrInvalidArgument)
	}
	mr := multipart.NewReader(r.Body, boundary)
	var out []uploadedFile
	for {
		part, err := mr.NextPart()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("multipart body: %v: %w", err, errdefs.ErrInvalidArgument)
		}
		if part.FormName() != "file" {
			part.Close()
			continue
		}
		dest := query
		if dest == "" {
			dest = partFileName(part)
		}
		if dest == "" {
			part.Close()
			return nil, fmt.Errorf("a file part has no file name and no path was given: %w", errdefs.ErrInvalidArgument)
		}
		f, err := write(dest, part)
		part.Close()
		if err != nil {
			return nil, err
		}
		out = append(out, f)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("multipart body has no part named \"file\": %w", errdefs.ErrInvalidArgument)
	}
	return out, nil
}

// partFileName is the file name of a part as the client sent it: E2B's
// SDKs put the file's path there, which multipart.Part.FileName would cut
// to its last element.
func partFileName(p *multipart.Part) string {
	_, params, err := mime.ParseMediaType(p.Header.Get("Content-Disposition"))
	if err != nil {
		return ""
	}
	return params["filename"]
}
