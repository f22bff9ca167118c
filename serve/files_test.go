package serve

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"mime/multipart"
	"net/http"
	"net/http/httptest"
	"net/textproto"
	"net/url"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"sort"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"hutch.dev/hutch/engine"
	"hutch.dev/hutch/serve/envdpb/filesystempb"
	"hutch.dev/hutch/serve/envdpb/filesystempb/filesystempbconnect"
)

func TestPartFileNameKeepsThePath(t *testing.T) {
	var body bytes.Buffer
	mw := multipart.NewWriter(&body)
	h := textproto.MIMEHeader{}
	h.Set("Content-Disposition", `form-data; name="file"; filename="/home/user/dir/a.txt"`)
	pw, _ := mw.CreatePart(h)
	pw.Write([]byte("x"))
	mw.Close()
	mr := multipart.NewReader(&body, mw.Boundary())
	part, err := mr.NextPart()
	if err != nil {
		t.Fatal(err)
	}
	if got := partFileName(part); got != "/home/user/dir/a.txt" {
		t.Fatalf("partFileName = %q, want the whole path the client sent", got)
	}
}

func TestLazyWriterDefersHeaders(t *testing.T) {
	rec := httptest.NewRecorder()
	lw := &lazyWriter{w: rec, start: func(h http.Header) { h.Set("Content-Type", "application/octet-stream") }}
	if lw.started {
		t.Fatal("started before the first byte")
	}
	writeError(rec, http.StatusNotFound, "gone")
	if rec.Code != http.StatusNotFound {
		t.Fatalf("status %d: an error before the first byte must keep its status", rec.Code)
	}

	rec = httptest.NewRecorder()
	lw = &lazyWriter{w: rec, start: func(h http.Header) { h.Set("Content-Type", "application/octet-stream") }}
	lw.Write([]byte("abc"))
	if rec.Code != http.StatusOK || rec.Header().Get("Content-Type") != "application/octet-stream" || rec.Body.String() != "abc" {
		t.Fatalf("after a write: %d %q %q", rec.Code, rec.Header().Get("Content-Type"), rec.Body.String())
	}
}

func TestFilesMethodNotAllowed(t *testing.T) {
	rec := httptest.NewRecorder()
	serveFiles(nil)(rec, httptest.NewRequest(http.MethodDelete, "/files?path=/a", nil))
	var body apiError
	json.Unmarshal(rec.Body.Bytes(), &body)
	if rec.Code != http.StatusMethodNotAllowed || body.Code != http.StatusMethodNotAllowed || !strings.Contains(body.Message, "DELETE") {
		t.Fatalf("DELETE /files: %d %s", rec.Code, rec.Body)
	}
}

// --- against a real sandbox ----------------------------------------------

// fsEnv is a busybox sandbox behind the filesystem service, served over
// HTTP as the router would (the target in the request's context).
type fsEnv struct {
	eng    *engine.Engine
	id     string
	srv    *httptest.Server
	client filesystempbconnect.FilesystemClient
}

// newFSEnv needs root, runsc and the built binaries: HUTCH_INTEGRATION=1 and
// HUTCH_BIN (as `make test` sets them).
func newFSEnv(t *testing.T) *fsEnv {
	t.Helper()
	bin := os.Getenv("HUTCH_BIN")
	if os.Getenv("HUTCH_INTEGRATION") == "" || bin == "" {
		t.Skip("integration test: needs HUTCH_INTEGRATION=1 and HUTCH_BIN (run through `make test`)")
	}
	if os.Geteuid() != 0 {
		t.Fatal("integration tests need root")
	}
	eng, err := engine.Open(engine.Options{
		Root:                t.TempDir(),
		RunscPath:           filepath.Join(bin, "runsc"),
		InitPath:            filepath.Join(bin, "hutch-init"),
		DefaultImageArchive: filepath.Join(bin, "images", "busybox.tar"),
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	sb, err := eng.Create(ctx, engine.CreateRequest{Image: "busybox"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := eng.Remove(context.Background(), sb.ID, true); err != nil {
			t.Errorf("remove sandbox: %v", err)
		}
	})
	fs := newFilesystemService(eng, WatchLimits{})
	t.Cleanup(fs.Close)
	mux := http.NewServeMux()
	mux.Handle(filesystempbconnect.NewFilesystemHandler(fs))
	mux.HandleFunc("/files", serveFiles(&hostPlacement{eng: eng, fs: fs}))
	tg := target{Tenant: "test", SandboxID: sb.ID}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mux.ServeHTTP(w, r.WithContext(withTarget(r.Context(), tg)))
	}))
	t.Cleanup(srv.Close)
	// E2B's SDKs speak the Connect protocol with JSON.
	client := filesystempbconnect.NewFilesystemClient(srv.Client(), srv.URL, connect.WithProtoJSON())
	return &fsEnv{eng: eng, id: sb.ID, srv: srv, client: client}
}

// as is the SDKs' Authorization header for user.
func as(user string) http.Header {
	h := http.Header{}
	h.Set("Authorization", "Basic "+base64.StdEncoding.EncodeToString([]byte(user+":")))
	return h
}

func req[T any](user string, msg *T) *connect.Request[T] {
	r := connect.NewRequest(msg)
	for k, v := range as(user) {
		r.Header()[k] = v
	}
	return r
}

// exec runs a shell command in the sandbox and returns its output, which
// it keeps in a file of the sandbox and reads back.
func (e *fsEnv) exec(t *testing.T, cmd string) string {
	t.Helper()
	ctx := context.Background()
	code, err := e.eng.Exec(ctx, e.id, engine.ExecRequest{Args: []string{"sh", "-c", "(" + cmd + ") >/tmp/.exec-out 2>&1"}})
	var out bytes.Buffer
	if rerr := e.eng.ReadFile(ctx, e.id, "/tmp/.exec-out", &out); rerr != nil {
		t.Fatalf("%s: reading its output: %v", cmd, rerr)
	}
	if err != nil || code != 0 {
		t.Fatalf("%s: exit %d, %v: %s", cmd, code, err, out.String())
	}
	return out.String()
}

// upload POSTs body to /files with the query and content type given.
func (e *fsEnv) upload(t *testing.T, query url.Values, contentType string, body io.Reader, header http.Header) (int, []byte) {
	t.Helper()
	r, err := http.NewRequest(http.MethodPost, e.srv.URL+"/files?"+query.Encode(), body)
	if err != nil {
		t.Fatal(err)
	}
	r.Header.Set("Content-Type", contentType)
	for k, v := range header {
		r.Header[k] = v
	}
	res, err := e.srv.Client().Do(r)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res.StatusCode, b
}

func (e *fsEnv) download(t *testing.T, query url.Values) (int, []byte) {
	t.Helper()
	res, err := e.srv.Client().Get(e.srv.URL + "/files?" + query.Encode())
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res.StatusCode, b
}

func TestFilesUploadDownload(t *testing.T) {
	e := newFSEnv(t)

	// An octet-stream upload to a relative path lands in the user's
	// home, owned by the user, parents included.
	code, body := e.upload(t, url.Values{"path": {"notes/hello.txt"}, "username": {"user"}}, "application/octet-stream", strings.NewReader("hello"), nil)
	var got []uploadedFile
	if code != http.StatusOK || json.Unmarshal(body, &got) != nil || len(got) != 1 ||
		!reflect.DeepEqual(got[0], uploadedFile{Name: "hello.txt", Type: "file", Path: "/home/user/notes/hello.txt"}) {
		t.Fatalf("upload: %d %s", code, body)
	}
	if out := e.exec(t, "stat -c '%U:%G %a' /home/user/notes /home/user/notes/hello.txt"); out != "user:user 755\nuser:user 644\n" {
		t.Fatalf("owners and modes in the sandbox: %q", out)
	}
	code, body = e.download(t, url.Values{"path": {"~/notes/hello.txt"}, "username": {"user"}})
	if code != http.StatusOK || string(body) != "hello" {
		t.Fatalf("download: %d %q", code, body)
	}

	// Root's relative paths are under /root; the Authorization header
	// names the user when the query does not.
	code, body = e.upload(t, url.Values{"path": {"r.txt"}}, "application/octet-stream", strings.NewReader("r"), as("root"))
	if code != http.StatusOK || !strings.Contains(string(body), `"/root/r.txt"`) {
		t.Fatalf("upload as root: %d %s", code, body)
	}

	// gzip-encoded upload, as the SDKs send with gzip: true.
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	zw.Write([]byte("compressed content"))
	zw.Close()
	h := http.Header{}
	h.Set("Content-Encoding", "gzip")
	if code, body := e.upload(t, url.Values{"path": {"/tmp/z.txt"}}, "application/octet-stream", &gz, h); code != http.StatusOK {
		t.Fatalf("gzip upload: %d %s", code, body)
	}
	if out := e.exec(t, "cat /tmp/z.txt"); out != "compressed content" {
		t.Fatalf("gzip upload wrote %q", out)
	}

	// Multipart with several files, their paths as file names.
	var mp bytes.Buffer
	mw := multipart.NewWriter(&mp)
	for name, content := range map[string]string{"/tmp/m/a.txt": "A", "m/b.txt": "B"} {
		h := textproto.MIMEHeader{}
		h.Set("Content-Disposition", fmt.Sprintf(`form-data; name="file"; filename=%q`, name))
		h.Set("Content-Type", "application/octet-stream")
		pw, _ := mw.CreatePart(h)
		pw.Write([]byte(content))
	}
	mw.Close()
	code, body = e.upload(t, url.Values{"username": {"user"}}, mw.FormDataContentType(), &mp, nil)
	got = nil
	if code != http.StatusOK || json.Unmarshal(body, &got) != nil || len(got) != 2 {
		t.Fatalf("multipart upload: %d %s", code, body)
	}
	paths := []string{got[0].Path, got[1].Path}
	sort.Strings(paths)
	if paths[0] != "/home/user/m/b.txt" || paths[1] != "/tmp/m/a.txt" {
		t.Fatalf("multipart upload wrote %v", paths)
	}
	if out := e.exec(t, "cat /tmp/m/a.txt /home/user/m/b.txt"); out != "AB" {
		t.Fatalf("multipart contents: %q", out)
	}

	// Errors: E2B's JSON with the status the SDKs map.
	for _, tc := range []struct {
		name  string
		code  int
		query url.Values
	}{
		{"missing file", http.StatusNotFound, url.Values{"path": {"/nope/missing"}}},
		{"traversal", http.StatusBadRequest, url.Values{"path": {"../../etc/shadow"}}},
		{"directory", http.StatusBadRequest, url.Values{"path": {"/tmp"}}},
		{"no path", http.StatusBadRequest, url.Values{}},
		{"unknown user", http.StatusUnauthorized, url.Values{"path": {"/etc/hostname"}, "username": {"mallory"}}},
	} {
		code, body := e.download(t, tc.query)
		var ae apiError
		if code != tc.code || json.Unmarshal(body, &ae) != nil || ae.Code != tc.code || ae.Message == "" {
			t.Errorf("%s: %d %s, want %d with E2B's error JSON", tc.name, code, body, tc.code)
		}
	}
	if code, body := e.upload(t, url.Values{"path": {"a/../../x"}}, "application/octet-stream", strings.NewReader("x"), nil); code != http.StatusBadRequest || !strings.Contains(string(body), "a/../../x") {
		t.Errorf("upload with ..: %d %s, want 400 naming the path", code, body)
	}
	if code, _ := e.upload(t, url.Values{}, "application/octet-stream", strings.NewReader("x"), nil); code != http.StatusBadRequest {
		t.Errorf("octet-stream upload without a path: %d, want 400", code)
	}
}

// heapPeak samples the heap until stop is closed and returns its peak.
func heapPeak(stop <-chan struct{}) <-chan uint64 {
	out := make(chan uint64, 1)
	go func() {
		var peak uint64
		var ms runtime.MemStats
		t := time.NewTicker(20 * time.Millisecond)
		defer t.Stop()
		for {
			runtime.ReadMemStats(&ms)
			peak = max(peak, ms.HeapInuse)
			select {
			case <-stop:
				out <- peak
				return
			case <-t.C:
			}
		}
	}()
	return out
}

// A file's metadata, given with its upload as E2B's SDK gives it, is kept
// on the file (as extended attributes the sandbox sees), answered by the
// upload, stat and list, and replaced whole by the next upload; metadata
// that cannot be kept is refused before anything is written.
func TestFilesMetadata(t *testing.T) {
	e := newFSEnv(t)
	ctx := context.Background()
	up := func(path string, meta map[string]string) (int, []uploadedFile, string) {
		t.Helper()
		h := http.Header{}
		for k, v := range meta {
			h.Set("X-Metadata-"+k, v)
		}
		code, body := e.upload(t, url.Values{"path": {path}, "username": {"root"}}, "application/octet-stream", strings.NewReader("data"), h)
		var got []uploadedFile
		json.Unmarshal(body, &got) //nolint:errcheck // an error answer is checked by its code
		return code, got, string(body)
	}
	stat := func(path string) map[string]string {
		t.Helper()
		res, err := e.client.Stat(ctx, req("root", &filesystempb.StatRequest{Path: path}))
		if err != nil {
			t.Fatalf("stat %s: %v", path, err)
		}
		return res.Msg.GetEntry().GetMetadata()
	}

	code, got, body := up("/tmp/m/report.txt", map[string]string{"Owner": "alice", "purpose": "weekly report"})
	want := map[string]string{"owner": "alice", "purpose": "weekly report"}
	if code != http.StatusOK || len(got) != 1 || !reflect.DeepEqual(got[0].Metadata, want) {
		t.Fatalf("upload with metadata: %d %s, want metadata %v", code, body, want)
	}
	if m := stat("/tmp/m/report.txt"); !reflect.DeepEqual(m, want) {
		t.Errorf("stat after the upload: metadata %v, want %v", m, want)
	}
	list, err := e.client.ListDir(ctx, req("root", &filesystempb.ListDirRequest{Path: "/tmp/m", Depth: 1}))
	if err != nil || len(list.Msg.GetEntries()) != 1 || !reflect.DeepEqual(list.Msg.GetEntries()[0].GetMetadata(), want) {
		t.Errorf("list: %v %v, want one entry with metadata %v", list, err, want)
	}

	// The next upload replaces the set; one without metadata clears it.
	if code, got, body := up("/tmp/m/report.txt", map[string]string{"owner": "bob"}); code != http.StatusOK || !reflect.DeepEqual(got[0].Metadata, map[string]string{"owner": "bob"}) {
		t.Errorf("second upload: %d %s, want metadata {owner: bob} alone", code, body)
	}
	if m := stat("/tmp/m/report.txt"); !reflect.DeepEqual(m, map[string]string{"owner": "bob"}) {
		t.Errorf("stat after the second upload: %v, want {owner: bob} alone", m)
	}
	if code, got, body := up("/tmp/m/report.txt", nil); code != http.StatusOK || got[0].Metadata != nil {
		t.Errorf("upload without metadata: %d %s, want no metadata left", code, body)
	}
	if m := stat("/tmp/m/report.txt"); len(m) != 0 {
		t.Errorf("stat after an upload without metadata: %v, want none", m)
	}

	for _, c := range []struct {
		meta map[string]string
		says string
	}{
		{map[string]string{"owner": "caf\u00e9"}, "printable US-ASCII"},
		{map[string]string{"k": strings.Repeat("v", 5000)}, "more than"},
		{map[string]string{strings.Repeat("k", 300): "v"}, "characters"},
	} {
		code, _, body := up("/tmp/m/refused.txt", c.meta)
		if code != http.StatusBadRequest || !strings.Contains(body, "invalid metadata") || !strings.Contains(body, c.says) {
			t.Errorf("upload with metadata %.40v: %d %s, want 400 saying %q", c.meta, code, body, c.says)
		}
	}
	if out := e.exec(t, "ls /tmp/m"); out != "report.txt\n" {
		t.Errorf("after the refused uploads /tmp/m holds %q, want report.txt alone", out)
	}
}

func TestFilesStreamLargeFile(t *testing.T) {
	e := newFSEnv(t)
	const size = 100 << 20
	seed := uint64(time.Now().UnixNano())
	src := func() io.Reader { return io.LimitReader(&randReader{r: rand.New(rand.NewPCG(seed, 1))}, size) }
	want := sha256.New()
	io.Copy(want, src())

	runtime.GC()
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	stop := make(chan struct{})
	peak := heapPeak(stop)

	if code, body := e.upload(t, url.Values{"path": {"/tmp/big"}}, "application/octet-stream", src(), as("root")); code != http.StatusOK {
		t.Fatalf("upload: %d %s", code, body)
	}
	res, err := e.srv.Client().Get(e.srv.URL + "/files?path=/tmp/big&username=root")
	if err != nil {
		t.Fatal(err)
	}
	got := sha256.New()
	n, err := io.Copy(got, res.Body)
	res.Body.Close()
	close(stop)
	if err != nil || n != size || !bytes.Equal(got.Sum(nil), want.Sum(nil)) {
		t.Fatalf("downloaded %d bytes (%v), sha256 match %v", n, err, bytes.Equal(got.Sum(nil), want.Sum(nil)))
	}
	if grew := int64(<-peak) - int64(before.HeapInuse); grew > 32<<20 {
		t.Fatalf("the heap grew by %d MiB moving a %d MiB file: it was buffered", grew>>20, size>>20)
	}
}

type randReader struct{ r *rand.Rand }

func (r *randReader) Read(p []byte) (int, error) {
	for i := range p {
		p[i] = byte(r.r.Uint32())
	}
	return len(p), nil
}

func TestFilesystemService(t *testing.T) {
	e := newFSEnv(t)
	ctx := context.Background()
	c := e.client

	// MakeDir: created for the user, then AlreadyExists.
	mk, err := c.MakeDir(ctx, req("user", &filesystempb.MakeDirRequest{Path: "proj/src"}))
	if err != nil {
		t.Fatal(err)
	}
	if en := mk.Msg.Entry; en.Path != "/home/user/proj/src" || en.Type != filesystempb.FileType_FILE_TYPE_DIRECTORY || en.Owner != "user" || en.Group != "user" {
		t.Fatalf("made %v", en)
	}
	_, err = c.MakeDir(ctx, req("user", &filesystempb.MakeDirRequest{Path: "/home/user/proj/src"}))
	if connect.CodeOf(err) != connect.CodeAlreadyExists {
		t.Fatalf("MakeDir of an existing directory: %v, want already_exists", err)
	}
	e.exec(t, "echo -n 12345 > /home/user/proj/src/main.go && ln -s src/main.go /home/user/proj/link && echo top > /home/user/proj/README")
	if _, err := c.MakeDir(ctx, req("user", &filesystempb.MakeDirRequest{Path: "proj/README"})); connect.CodeOf(err) != connect.CodeInvalidArgument {
		t.Fatalf("MakeDir over a file: %v, want invalid_argument", err)
	}

	// Stat.
	st, err := c.Stat(ctx, req("user", &filesystempb.StatRequest{Path: "~/proj/src/main.go"}))
	if err != nil {
		t.Fatal(err)
	}
	if en := st.Msg.Entry; en.Name != "main.go" || en.Size != 5 || en.Type != filesystempb.FileType_FILE_TYPE_FILE || en.Permissions != "-rw-r--r--" ||
		en.Owner != "root" || time.Since(en.ModifiedTime.AsTime()) > time.Hour {
		t.Fatalf("stat: %v", en)
	}
	st, err = c.Stat(ctx, req("user", &filesystempb.StatRequest{Path: "proj/link"}))
	if err != nil || st.Msg.Entry.Type != filesystempb.FileType_FILE_TYPE_SYMLINK || st.Msg.Entry.GetSymlinkTarget() != "/home/user/proj/src/main.go" {
		t.Fatalf("stat of a symlink: %v, %v", st, err)
	}
	if _, err := c.Stat(ctx, req("user", &filesystempb.StatRequest{Path: "/no/such"})); connect.CodeOf(err) != connect.CodeNotFound {
		t.Fatalf("stat of a missing file: %v, want not_found", err)
	}
	_, err = c.Stat(ctx, req("user", &filesystempb.StatRequest{Path: "proj/../../../etc/passwd"}))
	if connect.CodeOf(err) != connect.CodeInvalidArgument || !strings.Contains(err.Error(), "proj/../../../etc/passwd") {
		t.Fatalf("stat with ..: %v, want invalid_argument naming the path", err)
	}
	if _, err := c.Stat(ctx, req("mallory", &filesystempb.StatRequest{Path: "/"})); connect.CodeOf(err) != connect.CodeUnauthenticated {
		t.Fatalf("stat as an unknown user: %v, want unauthenticated", err)
	}

	// ListDir with depth.
	names := func(depth uint32) []string {
		t.Helper()
		ls, err := c.ListDir(ctx, req("user", &filesystempb.ListDirRequest{Path: "proj", Depth: depth}))
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, en := range ls.Msg.Entries {
			out = append(out, strings.TrimPrefix(en.Path, "/home/user/proj/"))
		}
		return out
	}
	if got := strings.Join(names(1), " "); got != "README link src" {
		t.Fatalf("depth 1: %s", got)
	}
	if got := strings.Join(names(0), " "); got != "README link src" {
		t.Fatalf("depth unset: %s, want depth 1", got)
	}
	if got := strings.Join(names(2), " "); got != "README link src src/main.go" {
		t.Fatalf("depth 2: %s", got)
	}
	if _, err := c.ListDir(ctx, req("user", &filesystempb.ListDirRequest{Path: "proj/README"})); connect.CodeOf(err) != connect.CodeInvalidArgument {
		t.Fatalf("ListDir of a file: %v, want invalid_argument", err)
	}
	if _, err := c.ListDir(ctx, req("user", &filesystempb.ListDirRequest{Path: "nothing-here"})); connect.CodeOf(err) != connect.CodeNotFound {
		t.Fatalf("ListDir of a missing directory: %v, want not_found", err)
	}

	// Move, into a directory that does not exist yet.
	mv, err := c.Move(ctx, req("user", &filesystempb.MoveRequest{Source: "proj/README", Destination: "docs/README.md"}))
	if err != nil || mv.Msg.Entry.Path != "/home/user/docs/README.md" || mv.Msg.Entry.Size != 4 {
		t.Fatalf("move: %v, %v", mv, err)
	}
	if out := e.exec(t, "stat -c %U /home/user/docs; cat /home/user/docs/README.md; test ! -e /home/user/proj/README && echo gone"); out != "user\ntop\ngone\n" {
		t.Fatalf("after the move: %q", out)
	}
	if _, err := c.Move(ctx, req("user", &filesystempb.MoveRequest{Source: "proj/README", Destination: "x"})); connect.CodeOf(err) != connect.CodeNotFound {
		t.Fatalf("move of a missing file: %v, want not_found", err)
	}

	// Remove: a tree, then again (no error, as envd).
	if _, err := c.Remove(ctx, req("user", &filesystempb.RemoveRequest{Path: "proj"})); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Remove(ctx, req("user", &filesystempb.RemoveRequest{Path: "proj"})); err != nil {
		t.Fatalf("removing what is gone: %v", err)
	}
	if _, err := c.Stat(ctx, req("user", &filesystempb.StatRequest{Path: "proj"})); connect.CodeOf(err) != connect.CodeNotFound {
		t.Fatalf("stat after remove: %v, want not_found", err)
	}
}

func TestFilesystemWatch(t *testing.T) {
	e := newFSEnv(t)
	c := e.client
	e.exec(t, "mkdir -p /tmp/w/sub")

	// WatchDir: the start event, then changes, recursively.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	r := req("root", &filesystempb.WatchDirRequest{Path: "/tmp/w", Recursive: true})
	stream, err := c.WatchDir(ctx, r)
	if err != nil {
		t.Fatal(err)
	}
	if !stream.Receive() || stream.Msg().GetStart() == nil {
		t.Fatalf("first message %v (%v), want the start event", stream.Msg(), stream.Err())
	}
	e.exec(t, "echo hi > /tmp/w/sub/new.txt")
	seen := false
	for !seen && stream.Receive() {
		fe := stream.Msg().GetFilesystem()
		seen = fe != nil && fe.Name == "sub/new.txt" && fe.Type == filesystempb.EventType_EVENT_TYPE_CREATE
	}
	if !seen {
		t.Fatalf("no create event for sub/new.txt: %v", stream.Err())
	}
	cancel()
	stream.Close()

	bg := context.Background()
	// A server stream's error comes with its first receive.
	s2, _ := c.WatchDir(bg, req("root", &filesystempb.WatchDirRequest{Path: "/tmp/w/sub/new.txt"}))
	if s2.Receive() || connect.CodeOf(s2.Err()) != connect.CodeInvalidArgument {
		t.Fatalf("watching a file: %v, want invalid_argument", s2.Err())
	}
	s3, _ := c.WatchDir(bg, req("root", &filesystempb.WatchDirRequest{Path: "/tmp/none"}))
	if s3.Receive() || connect.CodeOf(s3.Err()) != connect.CodeNotFound {
		t.Fatalf("watching a missing directory: %v, want not_found", s3.Err())
	}

	// Polling watchers.
	cw, err := c.CreateWatcher(bg, req("root", &filesystempb.CreateWatcherRequest{Path: "/tmp/w"}))
	if err != nil {
		t.Fatal(err)
	}
	id := cw.Msg.WatcherId
	e.exec(t, "touch /tmp/w/p1 && rm /tmp/w/p1")
	var events []*filesystempb.FilesystemEvent
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) && len(events) < 2 {
		res, err := c.GetWatcherEvents(bg, req("root", &filesystempb.GetWatcherEventsRequest{WatcherId: id}))
		if err != nil {
			t.Fatal(err)
		}
		events = append(events, res.Msg.Events...)
		time.Sleep(100 * time.Millisecond)
	}
	var kinds []string
	for _, ev := range events {
		if ev.Name == "p1" {
			kinds = append(kinds, ev.Type.String())
		}
	}
	if len(kinds) < 2 || kinds[0] != "EVENT_TYPE_CREATE" || kinds[len(kinds)-1] != "EVENT_TYPE_REMOVE" {
		t.Fatalf("polled events for p1: %v", kinds)
	}
	if _, err := c.RemoveWatcher(bg, req("root", &filesystempb.RemoveWatcherRequest{WatcherId: id})); err != nil {
		t.Fatal(err)
	}
	_, err = c.GetWatcherEvents(bg, req("root", &filesystempb.GetWatcherEventsRequest{WatcherId: id}))
	if connect.CodeOf(err) != connect.CodeNotFound {
		t.Fatalf("poll of a removed watcher: %v, want not_found", err)
	}
}
