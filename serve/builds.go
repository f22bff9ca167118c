package serve

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/containerd/errdefs"

	"hutch.dev/hutch/credential"
	"hutch.dev/hutch/engine"
	"hutch.dev/hutch/serve/tenant"
)

// Template builds from code: E2B's Template builder in the SDKs asks for
// a build (POST /v3/templates), uploads the files its COPY steps name
// (GET /templates/{id}/files/{hash}, then a PUT to the URL it answers),
// starts the build with its steps (POST /v2/templates/{id}/builds/{build})
// and polls its status and logs (GET .../status). The steps become a
// Dockerfile that BuildKit builds under gVisor as `hutch image build`
// does, into an image of the tenant's; a start command makes it a
// template that starts warm (docs/templates.md).

// builder is a placement that builds templates: the host's.
type builder interface {
	// buildTemplate builds b's Dockerfile in dir into tenant's image
	// name, logging to b; with a start command, its warm checkpoint too.
	buildTemplate(ctx context.Context, b *build, dir string) error
	// imageUser is the user image name runs as ("" for root).
	imageUser(ctx context.Context, tenantName, name string) (string, error)
	// baseImage is the engine's name of a build's FROM: templateID (the
	// tenant's own or a shared image) or an image reference.
	baseImage(ctx context.Context, tenantName, from string, template bool) (string, error)
}

// build is one template build and its log.
type build struct {
	tenant     string
	templateID string
	buildID    string
	// image is the engine's name of the image the build makes.
	image string

	mu      sync.Mutex
	status  string // waiting, building, ready, error
	entries []buildLogEntry
	reason  *buildReason
	// steps maps Dockerfile instruction numbers (1-based, FROM first)
	// to E2B's step names ("base", "1", ..., "finalize").
	steps []string
	// labels are the image's: the start command and ready check, and
	// labelBuild.
	labels map[string]string
	// tags are the template's tags the build gets besides its image's.
	tags []string
}

type buildLogEntry struct {
	Timestamp time.Time `json:"timestamp"`
	Level     string    `json:"level"`
	Message   string    `json:"message"`
	Step      string    `json:"step,omitempty"`
}

type buildReason struct {
	Message    string          `json:"message"`
	Step       string          `json:"step,omitempty"`
	LogEntries []buildLogEntry `json:"logEntries"`
}

// maxBuildLog bounds the entries one build keeps.
const maxBuildLog = 20000

// log adds an entry to the build's log.
func (b *build) log(level, step, msg string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.entries) >= maxBuildLog {
		return
	}
	b.entries = append(b.entries, buildLogEntry{Timestamp: time.Now().UTC(), Level: level, Message: msg, Step: step})
}

// Write takes BuildKit's and the template's output, a line an entry.
func (b *build) Write(p []byte) (int, error) {
	for _, line := range strings.Split(strings.TrimRight(string(p), "\n"), "\n") {
		if line != "" {
			b.log("info", "", line)
		}
	}
	return len(p), nil
}

// stepOf is E2B's name of the step of Dockerfile instruction n.
func (b *build) stepOf(n int) string {
	if n >= 1 && n <= len(b.steps) {
		return b.steps[n-1]
	}
	return ""
}

func (b *build) finish(err error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if err == nil {
		b.status = "ready"
		return
	}
	b.status = "error"
	r := &buildReason{Message: err.Error(), LogEntries: []buildLogEntry{}}
	var se *stepError
	if errors.As(err, &se) {
		r.Step = b.stepOf(se.instruction)
	}
	// The last lines are what a user reads first.
	from := max(0, len(b.entries)-50)
	r.LogEntries = append(r.LogEntries, b.entries[from:]...)
	b.reason = r
	b.entries = append(b.entries, buildLogEntry{Timestamp: time.Now().UTC(), Level: "error", Message: err.Error(), Step: r.Step})
}

// stepError is a build's failure in one Dockerfile instruction.
type stepError struct {
	instruction int
	err         error
}

func (e *stepError) Error() string { return e.err.Error() }
func (e *stepError) Unwrap() error { return e.err }

// vertexStep is BuildKit's name of a Dockerfile instruction's vertex:
// "[2/5] RUN ..." or "[stage-0 2/5] RUN ...".
var vertexStep = regexp.MustCompile(`^\[(?:[^\]]* )?(\d+)/\d+\]`)

// builds are the server's template builds, by build ID.
type builds struct {
	mu sync.Mutex
	m  map[string]*build
	// running is the build in progress per tenant: one at a time.
	running map[string]string
}

// buildFilesDir holds the tenants' uploaded COPY sources, by hash.
func (s *Server) buildFilesDir(tenantName string) string {
	return filepath.Join(s.cfg.StateDir, "template-files", tenantName)
}

// templateName splits a build's name NAME[:TAG] into the templateID and
// its tag (default latest).
func templateName(name string) (id, tag string, err error) {
	if err := checkTemplateID(name); err != nil {
		return "", "", fmt.Errorf("name: %w", err)
	}
	id, tag, ok := strings.Cut(name, ":")
	if !ok {
		tag = "latest"
	}
	return id, tag, nil
}

// requestBuild is POST /v3/templates: a new build of the tenant's
// template of that name.
func (s *Server) requestBuild(r *http.Request, tenantName string) (int, any, error) {
	if _, ok := s.place.(builder); !ok {
		return 0, nil, fmt.Errorf("template builds run on a host: this server places sandboxes on Kubernetes, where images are built and pushed to a registry the nodes pull from: %w", errdefs.ErrNotImplemented)
	}
	var body struct {
		Name          string   `json:"name"`
		Alias         string   `json:"alias"`
		Tags          []string `json:"tags"`
		CPUCount      *int     `json:"cpuCount"`
		MemoryMB      *int     `json:"memoryMB"`
		MinFreeDiskMB *int     `json:"minFreeDiskMb"`
		TeamID        string   `json:"teamID"`
	}
	if err := decodeBody(r, &body); err != nil {
		return 0, nil, err
	}
	name := body.Name
	if name == "" {
		name = body.Alias
	}
	if name == "" {
		return 0, nil, fmt.Errorf("name: a template build needs a name (NAME or NAME:TAG): %w", errdefs.ErrInvalidArgument)
	}
	id, tag, err := templateName(name)
	if err != nil {
		return 0, nil, err
	}
	tags := []string{tag}
	for _, t := range body.Tags {
		if err := checkTemplateID("t:" + t); err != nil {
			return 0, nil, fmt.Errorf("tags: %q is not a tag ([A-Za-z0-9_.-]): %w", t, errdefs.ErrInvalidArgument)
		}
		if t != tag {
			tags = append(tags, t)
		}
	}
	b := &build{tenant: tenantName, templateID: id, buildID: randomUUID(), image: tenantImage(tenantName, id+":"+tag), status: "waiting", tags: tags[1:]}
	s.builds.mu.Lock()
	if s.builds.m == nil {
		s.builds.m, s.builds.running = map[string]*build{}, map[string]string{}
	}
	s.builds.m[b.buildID] = b
	s.builds.mu.Unlock()
	b.log("info", "", fmt.Sprintf("build %s of template %s (tags %s) requested", b.buildID, id, strings.Join(tags, ", ")))
	return http.StatusAccepted, map[string]any{
		"templateID": id, "buildID": b.buildID, "public": false,
		"aliases": []string{id}, "names": []string{id}, "tags": tags,
	}, nil
}

// randomUUID is a random version 4 UUID, as E2B's build IDs are.
func randomUUID() string {
	h := randomHex(16)
	return h[0:8] + "-" + h[8:12] + "-4" + h[13:16] + "-a" + h[17:20] + "-" + h[20:32]
}

// buildOf is the tenant's build of the request's templateID and buildID;
// another tenant's answers as an unknown one.
func (s *Server) buildOf(r *http.Request, tenantName string) (*build, error) {
	s.builds.mu.Lock()
	b := s.builds.m[r.PathValue("buildID")]
	s.builds.mu.Unlock()
	if b == nil || b.tenant != tenantName || b.templateID != r.PathValue("templateID") {
		return nil, fmt.Errorf("build %q of template %q not found: %w", clip(r.PathValue("buildID"), 64), clip(r.PathValue("templateID"), 128), errdefs.ErrNotFound)
	}
	return b, nil
}

var filesHashRE = regexp.MustCompile(`^[0-9a-f]{64}$`)

// uploadExpiry is how long an upload URL is good for.
const uploadExpiry = 30 * time.Minute

// uploadSubject is what an upload token is for.
func uploadSubject(tenantName, hash string) string { return tenantName + "/" + hash }

// fileUploadLink is GET /templates/{templateID}/files/{hash}: whether the
// tenant has uploaded the COPY source of that hash already, and if not,
// a URL to PUT it to, signed for this tenant and hash only.
func (s *Server) fileUploadLink(r *http.Request, tenantName string) (int, any, error) {
	if _, ok := s.place.(builder); !ok {
		return 0, nil, fmt.Errorf("template builds run on a host: %w", errdefs.ErrNotImplemented)
	}
	if err := checkTemplateID(r.PathValue("templateID")); err != nil {
		return 0, nil, err
	}
	hash := r.PathValue("hash")
	if !filesHashRE.MatchString(hash) {
		return 0, nil, fmt.Errorf("hash %q: want 64 hex digits (SHA-256 of the files): %w", clip(hash, 80), errdefs.ErrInvalidArgument)
	}
	if _, err := os.Stat(filepath.Join(s.buildFilesDir(tenantName), hash+".tar")); err == nil {
		return http.StatusCreated, map[string]any{"present": true}, nil
	}
	until := time.Now().Add(uploadExpiry)
	token := s.tokens.Expiring(credential.Upload, uploadSubject(tenantName, hash), 0, until)
	u := "https://" + r.Host
	if r.TLS == nil {
		u = "http://" + r.Host
	}
	u += "/template-files/" + tenantName + "/" + hash + "?token=" + token
	return http.StatusCreated, map[string]any{"present": false, "url": u}, nil
}

// maxUpload bounds one uploaded COPY source.
const maxUpload = 1 << 30

// uploadFile is PUT /template-files/{tenant}/{hash}?token=T: the body is
// the tar (gzipped or not) of a COPY source, kept for the tenant's
// builds. The token, from fileUploadLink, is the only credential.
func (s *Server) uploadFile(w http.ResponseWriter, r *http.Request) {
	tenantName, hash := r.PathValue("tenant"), r.PathValue("hash")
	if !filesHashRE.MatchString(hash) || s.tokens.CheckExpiring(credential.Upload, uploadSubject(tenantName, hash), 0, r.URL.Query().Get("token"), time.Now()) != nil {
		writeError(w, http.StatusForbidden, "upload URL not valid, or expired: ask GET /templates/{templateID}/files/{hash} for a new one")
		return
	}
	s.conns.trust(r.Context())
	noDeadline(w)
	if r.ContentLength > maxUpload {
		writeError(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("upload of %d bytes: at most %d", r.ContentLength, maxUpload))
		return
	}
	dir := s.buildFilesDir(tenantName)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		writeErr(w, err)
		return
	}
	tmp, err := os.CreateTemp(dir, ".upload-*")
	if err != nil {
		writeErr(w, err)
		return
	}
	defer os.Remove(tmp.Name())
	n, err := io.Copy(tmp, io.LimitReader(r.Body, maxUpload+1))
	if err == nil && n > maxUpload {
		err = fmt.Errorf("upload larger than %d bytes: %w", maxUpload, errdefs.ErrInvalidArgument)
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), filepath.Join(dir, hash+".tar"))
	}
	if err != nil {
		writeErr(w, err)
		return
	}
	w.WriteHeader(http.StatusCreated)
}

// templateStep is one of E2B's TemplateStep: RUN [cmd, user?], COPY
// [src, dest, user, mode] with filesHash, ENV [k, v, ...], WORKDIR [dir],
// USER [user].
type templateStep struct {
	Type      string   `json:"type"`
	Args      []string `json:"args"`
	Force     bool     `json:"force"`
	FilesHash string   `json:"filesHash"`
	// What the SDK keeps for its own upload and sends along.
	ForceUpload     *bool `json:"forceUpload"`
	ResolveSymlinks *bool `json:"resolveSymlinks"`
	Gzip            *bool `json:"gzip"`
}

type buildStart struct {
	Force             bool            `json:"force"`
	FromImage         string          `json:"fromImage"`
	FromTemplate      string          `json:"fromTemplate"`
	FromImageRegistry json.RawMessage `json:"fromImageRegistry"`
	StartCmd          string          `json:"startCmd"`
	ReadyCmd          string          `json:"readyCmd"`
	Steps             []templateStep  `json:"steps"`
}

// startBuild is POST /v2/templates/{templateID}/builds/{buildID}: the
// steps are checked and turned into a Dockerfile now (a bad one answers
// 400 and builds nothing), and built in the background.
func (s *Server) startBuild(r *http.Request, tenantName string) (int, any, error) {
	bld, ok := s.place.(builder)
	if !ok {
		return 0, nil, fmt.Errorf("template builds run on a host: %w", errdefs.ErrNotImplemented)
	}
	b, err := s.buildOf(r, tenantName)
	if err != nil {
		return 0, nil, err
	}
	var body buildStart
	if err := decodeBody(r, &body); err != nil {
		return 0, nil, err
	}
	if len(body.FromImageRegistry) > 0 && string(body.FromImageRegistry) != "null" {
		return 0, nil, fmt.Errorf("fromImageRegistry: registry credentials in a build are not supported here: log the host in (hutch login) and pull the image (hutch image pull): %w", errdefs.ErrNotImplemented)
	}
	if (body.FromImage == "") == (body.FromTemplate == "") {
		return 0, nil, fmt.Errorf("exactly one of fromImage and fromTemplate: %w", errdefs.ErrInvalidArgument)
	}
	if body.ReadyCmd != "" && body.StartCmd == "" {
		return 0, nil, fmt.Errorf("readyCmd says when the startCmd is ready: give a startCmd: %w", errdefs.ErrInvalidArgument)
	}
	from, fromTemplate := body.FromImage, false
	if body.FromTemplate != "" {
		from, fromTemplate = body.FromTemplate, true
	}
	base, err := bld.baseImage(r.Context(), tenantName, from, fromTemplate)
	if err != nil {
		return 0, nil, err
	}
	user, err := bld.imageUser(r.Context(), tenantName, base)
	if err != nil {
		return 0, nil, err
	}
	dir, err := os.MkdirTemp("", "hutch-template-build-")
	if err != nil {
		return 0, nil, err
	}
	steps, err := s.writeContext(dir, tenantName, base, user, body)
	if err != nil {
		os.RemoveAll(dir)
		return 0, nil, err
	}
	s.builds.mu.Lock()
	if other := s.builds.running[tenantName]; other != "" {
		s.builds.mu.Unlock()
		os.RemoveAll(dir)
		return 0, nil, fmt.Errorf("build %s of this tenant is running: one build at a time: %w", other, errdefs.ErrResourceExhausted)
	}
	if b.status != "waiting" {
		s.builds.mu.Unlock()
		os.RemoveAll(dir)
		return 0, nil, fmt.Errorf("build %s was started already (%s): %w", b.buildID, b.status, errdefs.ErrConflict)
	}
	// A new image of the tenant's counts as a snapshot does.
	var want tenant.Usage
	if exists, err := s.place.HasSnapshot(r.Context(), tenantName, strings.TrimPrefix(b.image, tenantImage(tenantName, ""))); err == nil && !exists {
		want.Snapshots = 1
	}
	release, err := s.admit(r.Context(), tenantName, want)
	if err != nil {
		s.builds.mu.Unlock()
		os.RemoveAll(dir)
		return 0, nil, err
	}
	s.builds.running[tenantName] = b.buildID
	b.mu.Lock()
	b.status, b.steps = "building", steps
	b.labels = map[string]string{labelBuild: b.buildID}
	if body.StartCmd != "" {
		b.labels[engine.LabelStart] = body.StartCmd
		if body.ReadyCmd != "" {
			b.labels[engine.LabelReady] = readyCheck(body.ReadyCmd)
		}
	}
	b.mu.Unlock()
	s.builds.mu.Unlock()
	go func() {
		defer os.RemoveAll(dir)
		defer release()
		err := bld.buildTemplate(s.stopCtx, b, dir)
		if tg, ok := s.place.(tagger); ok && err == nil && len(b.tags) > 0 {
			_, tag, _ := strings.Cut(strings.TrimPrefix(b.image, tenantImage(tenantName, "")), ":")
			if _, err = tg.tagTemplate(s.stopCtx, tenantName, b.templateID, tag, b.tags); err != nil {
				err = fmt.Errorf("tagging the build %s: %w", strings.Join(b.tags, ", "), err)
			}
		}
		b.finish(err)
		s.builds.mu.Lock()
		delete(s.builds.running, tenantName)
		s.builds.mu.Unlock()
		s.log.Info("template build", "tenant", tenantName, "template", b.templateID, "build", b.buildID, "error", err)
	}()
	return http.StatusAccepted, nil, nil
}

// sdkWaitForPort is the ready command of the SDKs' waitForPort(PORT).
var sdkWaitForPort = regexp.MustCompile(`^\[ -n "\$\(ss -Htuln sport = :([0-9]{1,5})\)" \]$`)

// readyCheck is the template ready check of an SDK's readyCmd: a shell
// command, but the SDKs' waitForPort, which needs ss in the image, is
// the same check made from the host.
func readyCheck(cmd string) string {
	if m := sdkWaitForPort.FindStringSubmatch(cmd); m != nil {
		if p, err := strconv.Atoi(m[1]); err == nil && p >= 1 && p <= 65535 {
			return "port:" + m[1]
		}
	}
	return "cmd:" + cmd
}

// buildStatus is GET /templates/{templateID}/builds/{buildID}/status:
// the build's state and its log entries from logsOffset on.
func (s *Server) buildStatus(r *http.Request, tenantName string) (int, any, error) {
	b, err := s.buildOf(r, tenantName)
	if err != nil {
		return 0, nil, err
	}
	off := 0
	if v := r.URL.Query().Get("logsOffset"); v != "" {
		if off, err = strconv.Atoi(v); err != nil || off < 0 {
			return 0, nil, fmt.Errorf("logsOffset %q: want a number of entries, 0 or more: %w", clip(v, 40), errdefs.ErrInvalidArgument)
		}
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	entries := []buildLogEntry{}
	if off < len(b.entries) {
		entries = append(entries, b.entries[off:min(len(b.entries), off+1000)]...)
	}
	out := map[string]any{
		"templateID": b.templateID, "buildID": b.buildID, "status": b.status,
		"logEntries": entries, "logs": []string{},
	}
	if b.reason != nil {
		out["reason"] = b.reason
	}
	return http.StatusOK, out, nil
}

// templateAlias is GET /templates/aliases/{alias}: the tenant's template
// of that name, or 404 (another tenant's too).
func (s *Server) templateAlias(r *http.Request, tenantName, alias string) (int, any, error) {
	if err := checkTemplateID(alias); err != nil {
		return 0, nil, err
	}
	ok, err := s.place.HasSnapshot(r.Context(), tenantName, alias)
	if err != nil {
		return 0, nil, err
	}
	if tg, isTagger := s.place.(tagger); !ok && isTagger && !strings.Contains(alias, ":") {
		// A template whose builds all have other tags than latest.
		tags, _ := tg.templateTags(r.Context(), tenantName, alias)
		ok = len(tags) > 0
	}
	if !ok {
		return 0, nil, fmt.Errorf("template %q not found: %w", alias, errdefs.ErrNotFound)
	}
	return http.StatusOK, map[string]any{"templateID": alias, "public": false}, nil
}
