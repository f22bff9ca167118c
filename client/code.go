package client

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
)

// CodePort is the port of the code interpreter's server in a sandbox of
// the code-interpreter-v1 template.
const CodePort = 49999

// Code talks E2B's code-interpreter protocol to the server on CodePort of
// one sandbox: POST /execute and the /contexts calls.
type Code struct {
	// BaseURL is where the server answers, without a trailing slash.
	BaseURL string
	// Header is added to every request (routing headers, the token).
	Header http.Header
	// HTTP is the HTTP client; nil means http.DefaultClient.
	HTTP *http.Client
}

// Code is the code interpreter of s, reached through the server's port
// routing (E2b-Sandbox-Id and E2b-Sandbox-Port), its executions
// authorised by the sandbox's envd access token.
func (s *Sandbox) Code() *Code {
	h := http.Header{}
	h.Set("E2b-Sandbox-Id", s.ID)
	h.Set("E2b-Sandbox-Port", strconv.Itoa(CodePort))
	if s.AccessToken != "" {
		h.Set("X-Access-Token", s.AccessToken)
	}
	return &Code{BaseURL: s.dataURL(), Header: h, HTTP: s.c.HTTP}
}

// CodeRequest is one execution: Code in the context ContextID, or in
// the default context of Language (python when both are empty).
type CodeRequest struct {
	Code      string            `json:"code"`
	ContextID string            `json:"context_id,omitempty"`
	Language  string            `json:"language,omitempty"`
	EnvVars   map[string]string `json:"env_vars,omitempty"`
}

// CodeResult is a value the code displayed or ended with, in each
// format it has.
type CodeResult struct {
	Text       string          `json:"text,omitempty"`
	HTML       string          `json:"html,omitempty"`
	Markdown   string          `json:"markdown,omitempty"`
	SVG        string          `json:"svg,omitempty"`
	PNG        string          `json:"png,omitempty"`
	JPEG       string          `json:"jpeg,omitempty"`
	PDF        string          `json:"pdf,omitempty"`
	LaTeX      string          `json:"latex,omitempty"`
	JavaScript string          `json:"javascript,omitempty"`
	JSON       json.RawMessage `json:"json,omitempty"`
	// Data is a pandas DataFrame: its columns' values by column name.
	Data json.RawMessage `json:"data,omitempty"`
	// Chart is a matplotlib figure as E2B's chart object.
	Chart        json.RawMessage `json:"chart,omitempty"`
	Extra        json.RawMessage `json:"extra,omitempty"`
	IsMainResult bool            `json:"is_main_result"`
}

// CodeError is an exception the code raised.
type CodeError struct {
	Name      string `json:"name"`
	Value     string `json:"value"`
	Traceback string `json:"traceback"`
}

func (e *CodeError) Error() string { return e.Name + ": " + e.Value }

// CodeOutput is one line of an execution's stream. Type is stdout,
// stderr (Text), result (Result), error (Error) or number_of_executions
// (ExecutionCount).
type CodeOutput struct {
	Type           string
	Text           string
	ExecutionCount int
	Result         *CodeResult
	Error          *CodeError
}

// Execution is what an execution gave, in order within each kind.
type Execution struct {
	Results        []CodeResult
	Stdout         []string
	Stderr         []string
	Error          *CodeError
	ExecutionCount int
}

// Text is the text of the main result, if there is one.
func (x *Execution) Text() string {
	for _, r := range x.Results {
		if r.IsMainResult {
			return r.Text
		}
	}
	return ""
}

// CodeContext is one interpreter of the sandbox, whose state lasts
// between executions.
type CodeContext struct {
	ID       string `json:"id"`
	Language string `json:"language"`
	Cwd      string `json:"cwd"`
}

func (c *Code) http() *http.Client {
	if c.HTTP != nil {
		return c.HTTP
	}
	return http.DefaultClient
}

func (c *Code) request(ctx context.Context, method, path string, body any) (*http.Response, error) {
	var r io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return nil, err
		}
		r = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.BaseURL+path, r)
	if err != nil {
		return nil, err
	}
	for k, vs := range c.Header {
		req.Header[k] = vs
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.http().Do(req)
	if err != nil {
		return nil, err
	}
	if err := answerError(resp); err != nil {
		resp.Body.Close()
		return nil, err
	}
	return resp, nil
}

// Execute runs req and waits for its end, calling on (if not nil) with
// each output as it comes. An exception of the code is Execution.Error,
// not an error. Ending ctx stops the code (the server interrupts it).
func (c *Code) Execute(ctx context.Context, req CodeRequest, on func(CodeOutput)) (*Execution, error) {
	resp, err := c.request(ctx, http.MethodPost, "/execute", req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	x := &Execution{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 256<<20)
	for sc.Scan() {
		line := bytes.TrimSpace(sc.Bytes())
		if len(line) == 0 {
			continue
		}
		var head struct {
			Type           string `json:"type"`
			Text           string `json:"text"`
			ExecutionCount int    `json:"execution_count"`
		}
		if err := json.Unmarshal(line, &head); err != nil {
			return x, fmt.Errorf("the code interpreter answered a line that is not JSON: %q: %w", line, err)
		}
		o := CodeOutput{Type: head.Type}
		switch head.Type {
		case "end_of_execution":
			// Read the answer to its end, so that its connection
			// can carry the next request.
			io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10)) //nolint:errcheck // only for reuse
			return x, nil
		case "keepalive":
			continue
		case "stdout":
			o.Text = head.Text
			x.Stdout = append(x.Stdout, head.Text)
		case "stderr":
			o.Text = head.Text
			x.Stderr = append(x.Stderr, head.Text)
		case "number_of_executions":
			o.ExecutionCount = head.ExecutionCount
			x.ExecutionCount = head.ExecutionCount
		case "result":
			var r CodeResult
			if err := json.Unmarshal(line, &r); err != nil {
				return x, fmt.Errorf("a result of the code interpreter: %w", err)
			}
			o.Result = &r
			x.Results = append(x.Results, r)
		case "error":
			var e CodeError
			if err := json.Unmarshal(line, &e); err != nil {
				return x, fmt.Errorf("an error of the code interpreter: %w", err)
			}
			o.Error = &e
			x.Error = &e
		default:
			continue
		}
		if on != nil {
			on(o)
		}
	}
	if err := sc.Err(); err != nil {
		return x, err
	}
	return x, fmt.Errorf("the code interpreter's answer ended before end_of_execution")
}

// CreateContext starts a context of language (python, javascript,
// typescript or bash; empty is python) working in cwd (empty: the
// user's home).
func (c *Code) CreateContext(ctx context.Context, language, cwd string) (*CodeContext, error) {
	body := map[string]string{}
	if language != "" {
		body["language"] = language
	}
	if cwd != "" {
		body["cwd"] = cwd
	}
	resp, err := c.request(ctx, http.MethodPost, "/contexts", body)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var cc CodeContext
	return &cc, json.NewDecoder(resp.Body).Decode(&cc)
}

// ListContexts lists the sandbox's contexts, the default ones included.
func (c *Code) ListContexts(ctx context.Context) ([]CodeContext, error) {
	resp, err := c.request(ctx, http.MethodGet, "/contexts", nil)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var cs []CodeContext
	return cs, json.NewDecoder(resp.Body).Decode(&cs)
}

// RestartContext restarts context id: its state is gone.
func (c *Code) RestartContext(ctx context.Context, id string) error {
	resp, err := c.request(ctx, http.MethodPost, "/contexts/"+url.PathEscape(id)+"/restart", nil)
	if err != nil {
		return err
	}
	return resp.Body.Close()
}

// RemoveContext ends context id.
func (c *Code) RemoveContext(ctx context.Context, id string) error {
	resp, err := c.request(ctx, http.MethodDelete, "/contexts/"+url.PathEscape(id), nil)
	if err != nil {
		return err
	}
	return resp.Body.Close()
}

// Languages are the languages the code interpreter runs, by the names
// it takes for them.
var Languages = []string{"python", "javascript", "typescript", "bash"}

// IsLanguage tells whether name is a language the code interpreter
// runs (or one of its short names: py, js, ts, sh).
func IsLanguage(name string) bool {
	switch strings.ToLower(strings.TrimSpace(name)) {
	case "python", "python3", "py", "javascript", "js", "node", "typescript", "ts", "bash", "sh", "shell":
		return true
	}
	return false
}
