package serve

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/containerd/errdefs"

	"hutch.dev/hutch/credential"
	"hutch.dev/hutch/serve/tenant"
)

// E2B's volume content API (/volumecontent/{volumeID}/...): the SDK's
// Volume reads and writes a volume's files without a sandbox, with the
// volume's token (Authorization: Bearer) instead of an API key. A token
// is TENANT.MAC: derived for that tenant and volume (credential purpose
// volume), it names the tenant it is for, whose volume of that ID the
// call opens, and nothing else.

// volumeToken is the token of tenant's volume id.
func (s *Server) volumeToken(tenantName, id string) string {
	return tenantName + "." + s.tokens.Token(credential.Volume, tenantName+"/"+id, 0)
}

// volumeOfToken is the tenant a request's volume token is for, if it is
// the token of the request's volume.
func (s *Server) volumeOfToken(r *http.Request, id string) (string, bool) {
	tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok {
		return "", false
	}
	tenantName, _, ok := strings.Cut(tok, ".")
	if !ok || tenant.ValidateName(tenantName) != nil {
		return "", false
	}
	return tenantName, credential.Match(s.volumeToken(tenantName, id), tok)
}

// volumeRoots is a placement whose volumes' files the server opens: the
// host's.
type volumeRoots interface {
	// openVolume opens tenant's volume id's files as a root.
	openVolume(ctx context.Context, tenantName, id string) (*os.Root, error)
}

// volumeEntry is E2B's VolumeEntryStat.
type volumeEntry struct {
	Name   string    `json:"name"`
	Path   string    `json:"path"`
	Type   string    `json:"type"`
	Size   int64     `json:"size"`
	Mode   uint32    `json:"mode"`
	UID    uint32    `json:"uid"`
	GID    uint32    `json:"gid"`
	Atime  time.Time `json:"atime"`
	Mtime  time.Time `json:"mtime"`
	Ctime  time.Time `json:"ctime"`
	Target string    `json:"target,omitempty"`
}

// maxVolumeList bounds one listing.
const maxVolumeList = 100000

// serveVolumeContent serves /volumecontent/{volumeID}/{dir,path,file}.
// A wrong token and a volume of another tenant answer as an unknown
// volume does.
func (s *Server) serveVolumeContent(w http.ResponseWriter, r *http.Request) {
	id, op := r.PathValue("volumeID"), r.PathValue("op")
	tenantName, ok := s.volumeOfToken(r, id)
	notFound := fmt.Sprintf("volume %q not found, or its token (Authorization: Bearer) is wrong", clip(id, 100))
	if !ok {
		writeError(w, http.StatusNotFound, notFound)
		return
	}
	vr, ok := s.place.(volumeRoots)
	if !ok {
		writeErr(w, fmt.Errorf("volume contents: %w", errdefs.ErrNotImplemented))
		return
	}
	root, err := vr.openVolume(r.Context(), tenantName, id)
	if errors.Is(err, errdefs.ErrNotFound) {
		writeError(w, http.StatusNotFound, notFound)
		return
	}
	if err != nil {
		writeErr(w, err)
		return
	}
	defer root.Close()
	s.conns.trust(r.Context())
	q := r.URL.Query()
	rel, err := volumePath(q.Get("path"))
	if err != nil {
		writeErr(w, err)
		return
	}
	v := volumeFS{root: root}
	var out any
	status := http.StatusOK
	switch r.Method + " " + op {
	case "GET dir":
		depth := 1
		if d := q.Get("depth"); d != "" {
			if depth, err = strconv.Atoi(d); err != nil || depth < 1 || depth > 32 {
				writeErr(w, fmt.Errorf("depth %q: want 1 to 32: %w", clip(d, 20), errdefs.ErrInvalidArgument))
				return
			}
		}
		out, err = v.list(rel, depth)
	case "POST dir":
		if err = v.mkdir(rel, q.Get("force") == "true", modeOf(q.Get("mode"), 0o755)); err == nil {
			err = v.own(rel, q)
		}
		if err == nil {
			out, err = v.stat(rel)
			status = http.StatusCreated
		}
	case "GET path":
		out, err = v.stat(rel)
	case "PATCH path":
		var body struct {
			UID  *uint32 `json:"uid"`
			GID  *uint32 `json:"gid"`
			Mode *uint32 `json:"mode"`
		}
		if err = decodeBody(r, &body); err == nil {
			err = v.setattr(rel, body.UID, body.GID, body.Mode)
		}
		if err == nil {
			out, err = v.stat(rel)
		}
	case "DELETE path":
		if rel == "." {
			err = fmt.Errorf("path %q: the volume's root cannot be removed: %w", q.Get("path"), errdefs.ErrInvalidArgument)
		} else if _, err = root.Lstat(rel); err == nil {
			err = root.RemoveAll(rel)
			status = http.StatusNoContent
		}
	case "GET file":
		f, oerr := root.Open(rel)
		if oerr != nil {
			err = oerr
			break
		}
		defer f.Close()
		if st, serr := f.Stat(); serr != nil || !st.Mode().IsRegular() {
			err = fmt.Errorf("path %q is not a file: %w", q.Get("path"), errdefs.ErrInvalidArgument)
			break
		}
		noDeadline(w)
		w.Header().Set("Content-Type", "application/octet-stream")
		io.Copy(w, f) //nolint:errcheck // the client went away
		return
	case "PUT file":
		noDeadline(w)
		if r.ContentLength > 0 {
			release, aerr := s.admit(r.Context(), tenantName, tenant.Usage{Disk: r.ContentLength})
			if aerr != nil {
				writeErr(w, aerr)
				return
			}
			defer release()
		}
		if err = v.write(rel, r.Body, q.Get("force") == "true", modeOf(q.Get("mode"), 0o644)); err == nil {
			err = v.own(rel, q)
		}
		if err == nil {
			out, err = v.stat(rel)
			status = http.StatusCreated
		}
	default:
		writeError(w, http.StatusNotFound, fmt.Sprintf("%s /volumecontent/{volumeID}/%s is not a call of the volume content API", r.Method, clip(op, 40)))
		return
	}
	if errors.Is(err, fs.ErrNotExist) {
		writeError(w, http.StatusNotFound, fmt.Sprintf("path %q not found in volume %q", clip(q.Get("path"), 200), id))
		return
	}
	if err != nil {
		writeErr(w, volumeErr(err))
		return
	}
	if out == nil {
		w.WriteHeader(status)
		return
	}
	writeJSON(w, status, out)
}

// volumeErr is err as the API answers it: what os.Root refuses (a path
// out of the volume through a link) is bad input.
func volumeErr(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) && (strings.Contains(pe.Err.Error(), "escapes") || errors.Is(pe.Err, syscall.ELOOP)) {
		return fmt.Errorf("path %q leads out of the volume: %w", pe.Path, errdefs.ErrInvalidArgument)
	}
	if errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("%v: %w", err, errdefs.ErrAlreadyExists)
	}
	return err
}

// volumePath is a volume path ("/a/b", "a/b", "" for the root) as a name
// relative to the volume's root; ".." may not leave it.
func volumePath(p string) (string, error) {
	if strings.ContainsRune(p, 0) {
		return "", fmt.Errorf("path: a NUL byte: %w", errdefs.ErrInvalidArgument)
	}
	c := path.Clean("/" + p)
	if c == "/" {
		return ".", nil
	}
	return strings.TrimPrefix(c, "/"), nil
}

// modeOf parses an octal or decimal mode, keeping its permission bits
// only: no set-ID bit ever lands on the host.
func modeOf(s string, def fs.FileMode) fs.FileMode {
	if s == "" {
		return def
	}
	n, err := strconv.ParseUint(s, 0, 32)
	if err != nil {
		return def
	}
	return fs.FileMode(n) & fs.ModePerm
}

// volumeFS is a volume's files, every path resolved inside its root.
type volumeFS struct{ root *os.Root }

func (v volumeFS) entry(rel string, st fs.FileInfo) volumeEntry {
	e := volumeEntry{Name: st.Name(), Path: "/" + strings.TrimPrefix(rel, "."), Size: st.Size(), Mode: uint32(st.Mode().Perm()), Mtime: st.ModTime().UTC(), Type: "unknown"}
	if rel == "." {
		e.Path, e.Name = "/", "/"
	}
	switch {
	case st.Mode().IsRegular():
		e.Type = "file"
	case st.IsDir():
		e.Type = "directory"
	case st.Mode()&fs.ModeSymlink != 0:
		e.Type = "symlink"
		e.Target, _ = v.root.Readlink(rel)
	}
	if sys, ok := st.Sys().(*syscall.Stat_t); ok {
		e.UID, e.GID = sys.Uid, sys.Gid
		e.Atime = time.Unix(sys.Atim.Sec, sys.Atim.Nsec).UTC()
		e.Ctime = time.Unix(sys.Ctim.Sec, sys.Ctim.Nsec).UTC()
	}
	return e
}

func (v volumeFS) stat(rel string) (volumeEntry, error) {
	st, err := v.root.Lstat(rel)
	if err != nil {
		return volumeEntry{}, err
	}
	return v.entry(rel, st), nil
}

// list is the entries under directory rel, depth levels down, sorted by
// path.
func (v volumeFS) list(rel string, depth int) ([]volumeEntry, error) {
	st, err := v.root.Lstat(rel)
	if err != nil {
		return nil, err
	}
	if !st.IsDir() {
		return nil, fmt.Errorf("path /%s is not a directory: %w", strings.TrimPrefix(rel, "."), errdefs.ErrInvalidArgument)
	}
	out := []volumeEntry{}
	var walk func(dir string, left int) error
	walk = func(dir string, left int) error {
		f, err := v.root.Open(dir)
		if err != nil {
			return err
		}
		ents, err := f.ReadDir(-1)
		f.Close()
		if err != nil {
			return err
		}
		for _, ent := range ents {
			child := path.Join(dir, ent.Name())
			info, err := ent.Info()
			if err != nil {
				continue // gone meanwhile
			}
			if len(out) >= maxVolumeList {
				return fmt.Errorf("the listing has more than %d entries: ask for less depth: %w", maxVolumeList, errdefs.ErrInvalidArgument)
			}
			out = append(out, v.entry(child, info))
			if ent.IsDir() && left > 1 {
				if err := walk(child, left-1); err != nil {
					return err
				}
			}
		}
		return nil
	}
	if err := walk(rel, depth); err != nil {
		return nil, err
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Path < out[j].Path })
	return out, nil
}

func (v volumeFS) mkdir(rel string, parents bool, mode fs.FileMode) error {
	if rel == "." {
		return fmt.Errorf("the volume's root exists: %w", errdefs.ErrAlreadyExists)
	}
	if parents {
		return v.root.MkdirAll(rel, mode)
	}
	return v.root.Mkdir(rel, mode)
}

// write replaces file rel with r's content, through a new file renamed
// over it; with parents its directories are made.
func (v volumeFS) write(rel string, r io.Reader, parents bool, mode fs.FileMode) error {
	if rel == "." {
		return fmt.Errorf("path: the volume's root is a directory: %w", errdefs.ErrInvalidArgument)
	}
	if parents {
		if err := v.root.MkdirAll(path.Dir(rel), 0o755); err != nil {
			return err
		}
	}
	tmp := path.Join(path.Dir(rel), ".hutch-upload-"+randomHex(8))
	f, err := v.root.OpenFile(tmp, os.O_CREATE|os.O_EXCL|os.O_WRONLY, mode)
	if err != nil {
		return err
	}
	_, err = io.Copy(f, r)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = v.root.Chmod(tmp, mode)
	}
	if err == nil {
		err = v.root.Rename(tmp, rel)
	}
	if err != nil {
		v.root.Remove(tmp)
	}
	return err
}

// own gives rel the uid and gid a create asked for.
func (v volumeFS) own(rel string, q map[string][]string) error {
	var uid, gid *uint32
	for k, p := range map[string]**uint32{"uid": &uid, "gid": &gid} {
		if vals := q[k]; len(vals) > 0 && vals[0] != "" {
			n, err := strconv.ParseUint(vals[0], 10, 32)
			if err != nil {
				return fmt.Errorf("%s %q: want a number: %w", k, clip(vals[0], 20), errdefs.ErrInvalidArgument)
			}
			u := uint32(n)
			*p = &u
		}
	}
	return v.setattr(rel, uid, gid, nil)
}

func (v volumeFS) setattr(rel string, uid, gid, mode *uint32) error {
	if mode != nil {
		if err := v.root.Chmod(rel, fs.FileMode(*mode)&fs.ModePerm); err != nil {
			return err
		}
	}
	if uid == nil && gid == nil {
		return nil
	}
	u, g := -1, -1
	if uid != nil {
		u = int(*uid)
	}
	if gid != nil {
		g = int(*gid)
	}
	return v.root.Lchown(rel, u, g)
}
