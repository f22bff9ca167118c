// Package client is a Go client of `hutch serve` (and of any server that
// speaks E2B's API): the control plane over REST, and a sandbox's data
// plane over envd's Connect services, routed by E2B's sandbox headers.
// Go programs need no SDK of another language.
package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime/multipart"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"connectrpc.com/connect"

	"hutch.dev/hutch/serve/envdpb/filesystempb/filesystempbconnect"
	"hutch.dev/hutch/serve/envdpb/processpb/processpbconnect"
)

// EnvdPort is the port the data plane is addressed on.
const EnvdPort = 49983

// Client talks to one server with one API key.
type Client struct {
	// APIURL is the server's base URL (E2B_API_URL).
	APIURL string
	// SandboxURL is where the data plane is reached (E2B_SANDBOX_URL);
	// empty means APIURL.
	SandboxURL string
	// APIKey is the tenant's key (E2B_API_KEY).
	APIKey string
	// HTTP is the HTTP client; nil means http.DefaultClient.
	HTTP *http.Client
}

// Error is an error answer of the server.
type Error struct {
	Status  int    `json:"code"`
	Message string `json:"message"`
}

func (e *Error) Error() string { return fmt.Sprintf("%d: %s", e.Status, e.Message) }

// IsNotFound tells whether err is the server's 404.
func IsNotFound(err error) bool {
	var e *Error
	if errors.As(err, &e) {
		return e.Status == http.StatusNotFound
	}
	return connect.CodeOf(err) == connect.CodeNotFound
}

func (c *Client) http() *http.Client {
	if c.HTTP != nil {
		return c.HTTP
	}
	return http.DefaultClient
}

// do sends a control-plane request with body as JSON and decodes the
// answer into out (if not nil).
func (c *Client) do(ctx context.Context, method, path string, body, out any) (*http.Response, error) {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return nil, err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, strings.TrimRight(c.APIURL, "/")+path, rd)
	if err != nil {
		return nil, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if c.APIKey != "" {
		req.Header.Set("X-API-Key", c.APIKey)
	}
	resp, err := c.http().Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode >= 400 {
		e := &Error{Status: resp.StatusCode}
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		if json.Unmarshal(b, e) != nil || e.Message == "" {
			e.Message = strings.TrimSpace(string(b))
		}
		e.Status = resp.StatusCode
		return resp, e
	}
	if out != nil {
		if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
			return resp, fmt.Errorf("%s %s: decode answer: %w", method, path, err)
		}
	}
	return resp, nil
}

// CreateRequest is a new sandbox (E2B's NewSandbox).
type CreateRequest struct {
	TemplateID string `json:"templateID"`
	// Timeout is the sandbox's lifetime in seconds.
	Timeout             int               `json:"timeout,omitempty"`
	AutoPause           bool              `json:"autoPause,omitempty"`
	AllowInternetAccess *bool             `json:"allow_internet_access,omitempty"`
	Network             *Network          `json:"network,omitempty"`
	Metadata            map[string]string `json:"metadata,omitempty"`
	EnvVars             map[string]string `json:"envVars,omitempty"`
	VolumeMounts        []VolumeMount     `json:"volumeMounts,omitempty"`
}

// Network is a sandbox's egress (E2B's SandboxNetworkConfig).
type Network struct {
	AllowOut           []string `json:"allowOut,omitempty"`
	DenyOut            []string `json:"denyOut,omitempty"`
	AllowPublicTraffic *bool    `json:"allowPublicTraffic,omitempty"`
}

// Info describes a sandbox (E2B's SandboxDetail).
type Info struct {
	SandboxID  string            `json:"sandboxID"`
	TemplateID string            `json:"templateID"`
	State      string            `json:"state"`
	StartedAt  time.Time         `json:"startedAt"`
	EndAt      time.Time         `json:"endAt"`
	CPUCount   int               `json:"cpuCount"`
	MemoryMB   int64             `json:"memoryMB"`
	DiskSizeMB int64             `json:"diskSizeMB"`
	Metadata   map[string]string `json:"metadata"`
	// VolumeMounts are the volumes the sandbox was created with.
	VolumeMounts []VolumeMount `json:"volumeMounts"`
}

// sandboxJSON is what create, connect and fork answer.
type sandboxJSON struct {
	SandboxID          string  `json:"sandboxID"`
	TemplateID         string  `json:"templateID"`
	EnvdVersion        string  `json:"envdVersion"`
	EnvdAccessToken    string  `json:"envdAccessToken"`
	TrafficAccessToken *string `json:"trafficAccessToken"`
	Domain             *string `json:"domain"`
}

// Sandbox is a sandbox this client may use: its ID and access token.
type Sandbox struct {
	ID          string
	AccessToken string
	// Domain is the domain of its hosts: PORT-ID.Domain.
	Domain string
	c      *Client
}

func (c *Client) sandbox(s sandboxJSON) *Sandbox {
	sb := &Sandbox{ID: s.SandboxID, AccessToken: s.EnvdAccessToken, c: c}
	if s.Domain != nil {
		sb.Domain = *s.Domain
	}
	return sb
}

// Sandbox is sandbox id as reached with its access token alone, as its
// tenant may hand them to someone else: its data plane needs no API key.
func (c *Client) Sandbox(id, accessToken string) *Sandbox {
	return &Sandbox{ID: id, AccessToken: accessToken, c: c}
}

// Create creates a sandbox.
func (c *Client) Create(ctx context.Context, req CreateRequest) (*Sandbox, error) {
	var out sandboxJSON
	if _, err := c.do(ctx, http.MethodPost, "/v2/sandboxes", req, &out); err != nil {
		return nil, err
	}
	return c.sandbox(out), nil
}

// Connect returns a sandbox of the tenant, resuming it if it is paused,
// and makes its lifetime at least timeout.
func (c *Client) Connect(ctx context.Context, id string, timeout time.Duration) (*Sandbox, error) {
	var out sandboxJSON
	body := map[string]int{"timeout": int(timeout / time.Second)}
	if _, err := c.do(ctx, http.MethodPost, "/v2/sandboxes/"+url.PathEscape(id)+"/connect", body, &out); err != nil {
		return nil, err
	}
	return c.sandbox(out), nil
}

// RotateTokens replaces a sandbox's access tokens with new ones (hutch's
// POST /sandboxes/{id}/tokens): the old ones open nothing from then on.
// The sandbox returned holds the new access token.
func (c *Client) RotateTokens(ctx context.Context, id string) (*Sandbox, error) {
	var out sandboxJSON
	if _, err := c.do(ctx, http.MethodPost, "/sandboxes/"+url.PathEscape(id)+"/tokens", struct{}{}, &out); err != nil {
		return nil, err
	}
	return c.sandbox(out), nil
}

// ListOptions filter a list.
type ListOptions struct {
	// State is "running", "paused" or empty for both.
	State    string
	Metadata map[string]string
}

// List lists the tenant's sandboxes, every page.
func (c *Client) List(ctx context.Context, o ListOptions) ([]Info, error) {
	q := url.Values{}
	if o.State != "" {
		q.Set("state", o.State)
	}
	if len(o.Metadata) > 0 {
		m := url.Values{}
		for k, v := range o.Metadata {
			m.Set(k, v)
		}
		q.Set("metadata", m.Encode())
	}
	var all []Info
	for page := 0; page < 10000; page++ {
		var out []Info
		resp, err := c.do(ctx, http.MethodGet, "/v2/sandboxes?"+q.Encode(), nil, &out)
		if err != nil {
			return nil, err
		}
		all = append(all, out...)
		next := resp.Header.Get("X-Next-Token")
		if next == "" {
			return all, nil
		}
		q.Set("nextToken", next)
	}
	return all, nil
}

// Get describes a sandbox.
func (c *Client) Get(ctx context.Context, id string) (*Info, error) {
	var out Info
	if _, err := c.do(ctx, http.MethodGet, "/sandboxes/"+url.PathEscape(id), nil, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// Kill removes a sandbox.
func (c *Client) Kill(ctx context.Context, id string) error {
	_, err := c.do(ctx, http.MethodDelete, "/sandboxes/"+url.PathEscape(id), nil, nil)
	return err
}

// Pause checkpoints a sandbox's memory and files; Connect resumes it.
func (c *Client) Pause(ctx context.Context, id string) error {
	_, err := c.do(ctx, http.MethodPost, "/sandboxes/"+url.PathEscape(id)+"/pause", struct{}{}, nil)
	return err
}

// SetTimeout gives a sandbox a new lifetime from now.
func (c *Client) SetTimeout(ctx context.Context, id string, timeout time.Duration) error {
	_, err := c.do(ctx, http.MethodPost, "/sandboxes/"+url.PathEscape(id)+"/timeout", map[string]int{"timeout": int(timeout / time.Second)}, nil)
	return err
}

// Fork makes count running copies of a sandbox.
func (c *Client) Fork(ctx context.Context, id string, count int, timeout time.Duration) ([]*Sandbox, error) {
	var out []struct {
		Sandbox *sandboxJSON `json:"sandbox"`
		Error   *Error       `json:"error"`
	}
	body := map[string]int{"count": count, "timeout": int(timeout / time.Second)}
	if _, err := c.do(ctx, http.MethodPost, "/sandboxes/"+url.PathEscape(id)+"/fork", body, &out); err != nil {
		return nil, err
	}
	var sbs []*Sandbox
	var errs []error
	for _, r := range out {
		if r.Error != nil {
			errs = append(errs, r.Error)
			continue
		}
		if r.Sandbox != nil {
			sbs = append(sbs, c.sandbox(*r.Sandbox))
		}
	}
	return sbs, errors.Join(errs...)
}

// Snapshot makes a template of a sandbox's files; name may be empty.
// Create starts from it with TemplateID set to the returned ID.
func (c *Client) Snapshot(ctx context.Context, id, name string) (string, error) {
	var out struct {
		SnapshotID string `json:"snapshotID"`
	}
	body := map[string]string{}
	if name != "" {
		body["name"] = name
	}
	if _, err := c.do(ctx, http.MethodPost, "/sandboxes/"+url.PathEscape(id)+"/snapshots", body, &out); err != nil {
		return "", err
	}
	return out.SnapshotID, nil
}

// UpdateNetwork replaces a sandbox's egress policy.
func (c *Client) UpdateNetwork(ctx context.Context, id string, n Network, internet *bool) error {
	body := map[string]any{}
	if n.AllowOut != nil {
		body["allowOut"] = n.AllowOut
	}
	if n.DenyOut != nil {
		body["denyOut"] = n.DenyOut
	}
	if internet != nil {
		body["allow_internet_access"] = *internet
	}
	_, err := c.do(ctx, http.MethodPut, "/sandboxes/"+url.PathEscape(id)+"/network", body, nil)
	return err
}

// dataHeaders route a data-plane request to the sandbox and authorise it.
func (s *Sandbox) dataHeaders(h http.Header, user string) {
	h.Set("E2b-Sandbox-Id", s.ID)
	h.Set("E2b-Sandbox-Port", strconv.Itoa(EnvdPort))
	if s.AccessToken != "" {
		h.Set("X-Access-Token", s.AccessToken)
	}
	if user != "" {
		h.Set("Authorization", "Basic "+basic(user))
	}
}

func basic(user string) string {
	return base64Std(user + ":")
}

func (s *Sandbox) dataURL() string {
	u := s.c.SandboxURL
	if u == "" {
		u = s.c.APIURL
	}
	return strings.TrimRight(u, "/")
}

// interceptor adds the sandbox's routing headers to every call.
func (s *Sandbox) interceptor(user string) connect.Interceptor {
	return headerInterceptor(func(h http.Header) { s.dataHeaders(h, user) })
}

// Process is the sandbox's envd process service, acting as user ("" for
// the server's default, "user").
func (s *Sandbox) Process(user string) processpbconnect.ProcessClient {
	return processpbconnect.NewProcessClient(s.c.http(), s.dataURL(), connect.WithProtoJSON(), connect.WithInterceptors(s.interceptor(user)))
}

// Filesystem is the sandbox's envd filesystem service, acting as user.
func (s *Sandbox) Filesystem(user string) filesystempbconnect.FilesystemClient {
	return filesystempbconnect.NewFilesystemClient(s.c.http(), s.dataURL(), connect.WithProtoJSON(), connect.WithInterceptors(s.interceptor(user)))
}

// RunRequest is a command to run.
type RunRequest struct {
	// Cmd is run by /bin/bash -l -c, as E2B's SDKs run commands.
	Cmd  string
	Envs map[string]string
	Cwd  string
	User string
	// Stdout and Stderr, if set, get the output as it comes.
	Stdout, Stderr io.Writer
}

// Result is a finished command.
type Result struct {
	ExitCode int
	Stdout   string
	Stderr   string
	Error    string
}

// Run runs a command and waits for it, streaming its output.
func (s *Sandbox) Run(ctx context.Context, req RunRequest) (*Result, error) {
	c, err := s.Start(ctx, ExecRequest{
		Cmd: "/bin/bash", Args: []string{"-l", "-c", req.Cmd}, Envs: req.Envs, Cwd: req.Cwd,
		User: req.User, Stdout: req.Stdout, Stderr: req.Stderr,
	})
	if err != nil {
		return nil, err
	}
	return c.Wait(ctx)
}

// WriteFile uploads r to path in the sandbox (E2B's POST /files).
func (s *Sandbox) WriteFile(ctx context.Context, path string, r io.Reader, user string) error {
	pr, pw := io.Pipe()
	mw := multipart.NewWriter(pw)
	go func() {
		part, err := mw.CreateFormFile("file", path)
		if err == nil {
			_, err = io.Copy(part, r)
		}
		if err == nil {
			err = mw.Close()
		}
		pw.CloseWithError(err)
	}()
	q := url.Values{"path": {path}}
	if user != "" {
		q.Set("username", user)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.dataURL()+"/files?"+q.Encode(), pr)
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", mw.FormDataContentType())
	s.dataHeaders(req.Header, user)
	resp, err := s.c.http().Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	return answerError(resp)
}

// ReadFile downloads path from the sandbox into w (E2B's GET /files).
func (s *Sandbox) ReadFile(ctx context.Context, path string, w io.Writer, user string) error {
	q := url.Values{"path": {path}}
	if user != "" {
		q.Set("username", user)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.dataURL()+"/files?"+q.Encode(), nil)
	if err != nil {
		return err
	}
	s.dataHeaders(req.Header, user)
	resp, err := s.c.http().Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if err := answerError(resp); err != nil {
		return err
	}
	_, err = io.Copy(w, resp.Body)
	return err
}

func answerError(resp *http.Response) error {
	if resp.StatusCode < 400 {
		return nil
	}
	e := &Error{Status: resp.StatusCode}
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if json.Unmarshal(b, e) != nil || e.Message == "" {
		e.Message = strings.TrimSpace(string(b))
	}
	e.Status = resp.StatusCode
	return e
}
