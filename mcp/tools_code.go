package mcp

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/containerd/errdefs"
	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"hutch.dev/hutch/client"
)

// --- run_code, create_code_context, restart_code_context ------------------------
//
// A sandbox of the code-interpreter-v1 image runs the code interpreter's
// server (client.CodePort): run_code runs code in one of its contexts,
// whose variables last between calls, and returns its rich results
// (figures as images, DataFrames as text tables). In a sandbox without
// it, run_code feeds the code to a fresh interpreter's standard input.

type codeArgs struct {
	sandboxArg
	Language       string `json:"language,omitempty" jsonschema:"python (default), javascript (node), typescript or bash"`
	Code           string `json:"code" jsonschema:"the code to run"`
	ContextID      string `json:"context_id,omitempty" jsonschema:"a context create_code_context returned; default: the sandbox's context of the language"`
	TimeoutSeconds int64  `json:"timeout_seconds,omitempty" jsonschema:"seconds before the code is stopped (default 120, at most 3600)"`
}

// codeResult is what run_code gave.
type codeResult struct {
	runResult
	// Stateful: the code ran in a context of the sandbox's code
	// interpreter, whose state lasts; false: in a fresh interpreter.
	Stateful  bool         `json:"stateful" jsonschema:"true if the code ran in a context whose variables last between calls"`
	ContextID string       `json:"context_id,omitempty"`
	Results   []codeOutput `json:"results,omitempty" jsonschema:"the values the code displayed or ended with"`
	Error     *codeError   `json:"error,omitempty" jsonschema:"the exception the code raised"`
}

type codeOutput struct {
	Text    string   `json:"text,omitempty"`
	Formats []string `json:"formats" jsonschema:"the formats the value has: png, html, data (a DataFrame), chart..."`
	Main    bool     `json:"main" jsonschema:"true for the value of the code's last expression"`
}

type codeError struct {
	Name      string `json:"name"`
	Value     string `json:"value"`
	Traceback string `json:"traceback"`
}

type contextArgs struct {
	sandboxArg
	Language string `json:"language,omitempty" jsonschema:"python (default), javascript, typescript or bash"`
	Cwd      string `json:"cwd,omitempty" jsonschema:"its working directory (default /home/user)"`
}

type contextResult struct {
	ContextID string `json:"context_id"`
	Language  string `json:"language"`
	Cwd       string `json:"cwd"`
}

type restartArgs struct {
	sandboxArg
	ContextID string `json:"context_id" jsonschema:"the context to restart"`
}

type restartResult struct {
	ContextID string `json:"context_id"`
	Restarted bool   `json:"restarted"`
}

// codeLanguage is the code interpreter's name of language.
func codeLanguage(language string) (string, error) {
	switch strings.ToLower(language) {
	case "", "python", "python3":
		return "python", nil
	case "javascript", "js", "node":
		return "javascript", nil
	case "typescript", "ts":
		return "typescript", nil
	case "bash", "sh":
		return "bash", nil
	}
	return "", fmt.Errorf("language %q: want python, javascript (node), typescript or bash: %w", language, errdefs.ErrInvalidArgument)
}

// noInterpreter tells whether err means that nothing answers on the
// code interpreter's port: no request reached it.
func noInterpreter(err error) bool {
	var ce *client.Error
	if errors.As(err, &ce) {
		return ce.Status == http.StatusBadGateway && strings.Contains(ce.Message, "nothing answers")
	}
	var de *dialError
	return errors.As(err, &de)
}

// dialError is a connection to the code interpreter's port that failed.
type dialError struct{ err error }

func (e *dialError) Error() string { return e.err.Error() }
func (e *dialError) Unwrap() error { return e.err }

func (s *Server) runCode(ctx context.Context, a codeArgs) (*sdk.CallToolResult, codeResult, error) {
	lang, err := codeLanguage(a.Language)
	if err != nil {
		return nil, codeResult{}, err
	}
	if strings.TrimSpace(a.Code) == "" {
		return nil, codeResult{}, fmt.Errorf("code is empty: %w", errdefs.ErrInvalidArgument)
	}
	timeout, err := s.timeout(a.TimeoutSeconds)
	if err != nil {
		return nil, codeResult{}, err
	}
	if err := checkRef(a.SandboxID); err != nil {
		return nil, codeResult{}, err
	}
	cl, done, err := s.be.code(ctx, a.SandboxID)
	if err != nil {
		return nil, codeResult{}, err
	}
	defer done()
	req := client.CodeRequest{Code: a.Code, ContextID: a.ContextID}
	if a.ContextID == "" {
		req.Language = lang
	}
	xctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	x, err := cl.Execute(xctx, req, nil)
	switch {
	case err != nil && noInterpreter(err):
		if a.ContextID != "" {
			return nil, codeResult{}, fmt.Errorf("sandbox %s has no code interpreter, so no context %s: create the sandbox with image code-interpreter-v1: %w", a.SandboxID, a.ContextID, errdefs.ErrFailedPrecondition)
		}
		return s.runCodeFresh(ctx, a, lang, timeout)
	case err != nil && xctx.Err() != nil && ctx.Err() == nil:
		return nil, codeResult{}, fmt.Errorf("the code did not finish within %s and was stopped; the context keeps its state: %w", timeout, context.DeadlineExceeded)
	case client.IsNotFound(err) && a.ContextID != "":
		return nil, codeResult{}, fmt.Errorf("sandbox %s has no code context %s: %w", a.SandboxID, a.ContextID, errdefs.ErrNotFound)
	case err != nil:
		return nil, codeResult{}, fmt.Errorf("the code interpreter of sandbox %s: %w", a.SandboxID, err)
	}
	return codeToolResult(x, a.ContextID)
}

// runCodeFresh runs the code in a new interpreter process that reads it on
// its standard input: a sandbox without the code interpreter.
func (s *Server) runCodeFresh(ctx context.Context, a codeArgs, lang string, timeout time.Duration) (*sdk.CallToolResult, codeResult, error) {
	args, ok := interpreters[lang]
	if !ok {
		return nil, codeResult{}, fmt.Errorf("language %s needs the code interpreter: create the sandbox with image code-interpreter-v1: %w", lang, errdefs.ErrFailedPrecondition)
	}
	res, err := s.be.exec(ctx, a.SandboxID, execSpec{Args: args, Stdin: a.Code, Timeout: timeout})
	if err != nil {
		return nil, codeResult{}, err
	}
	if res.missing {
		return nil, codeResult{}, fmt.Errorf("%s is not installed in %s: create a sandbox on the default image \"base\", which has python3, node and bash: %w",
			args[0], res.where, errdefs.ErrNotFound)
	}
	out := textResult(res.runResult)
	out.Content = append(out.Content, &sdk.TextContent{Text: "(a fresh interpreter: nothing is kept for the next run_code; a sandbox of image code-interpreter-v1 keeps its variables)"})
	return out, codeResult{runResult: res.runResult}, nil
}

// codeToolResult renders an execution for the model: its output and
// results as text (a DataFrame's text is its table), its figures and
// other images as image content.
func codeToolResult(x *client.Execution, contextID string) (*sdk.CallToolResult, codeResult, error) {
	r := codeResult{Stateful: true, ContextID: contextID}
	r.Stdout, r.Stderr = strings.Join(x.Stdout, ""), strings.Join(x.Stderr, "")
	var b strings.Builder
	var images []sdk.Content
	if r.Stdout != "" {
		fmt.Fprintf(&b, "--- stdout ---\n%s", r.Stdout)
		if !strings.HasSuffix(r.Stdout, "\n") {
			b.WriteString("\n")
		}
	}
	if r.Stderr != "" {
		fmt.Fprintf(&b, "--- stderr ---\n%s", r.Stderr)
		if !strings.HasSuffix(r.Stderr, "\n") {
			b.WriteString("\n")
		}
	}
	for i, res := range x.Results {
		o := codeOutput{Text: res.Text, Main: res.IsMainResult, Formats: formatsOf(res)}
		r.Results = append(r.Results, o)
		label := "display"
		if res.IsMainResult {
			label = "result"
		}
		fmt.Fprintf(&b, "--- %s %d (%s) ---\n", label, i+1, strings.Join(o.Formats, ", "))
		if res.Text != "" {
			b.WriteString(res.Text)
			if !strings.HasSuffix(res.Text, "\n") {
				b.WriteString("\n")
			}
		}
		for _, img := range []struct{ data, mime string }{{res.PNG, "image/png"}, {res.JPEG, "image/jpeg"}} {
			if img.data == "" {
				continue
			}
			raw, err := base64.StdEncoding.DecodeString(strings.TrimSpace(img.data))
			if err != nil {
				fmt.Fprintf(&b, "(its %s is not base64: %v)\n", img.mime, err)
				continue
			}
			images = append(images, &sdk.ImageContent{Data: raw, MIMEType: img.mime})
			fmt.Fprintf(&b, "(%s image attached)\n", img.mime)
		}
	}
	if x.Error != nil {
		r.ExitCode = 1
		r.Error = &codeError{Name: x.Error.Name, Value: x.Error.Value, Traceback: x.Error.Traceback}
		fmt.Fprintf(&b, "--- error ---\n%s: %s\n", x.Error.Name, x.Error.Value)
		if x.Error.Traceback != "" {
			fmt.Fprintf(&b, "%s\n", x.Error.Traceback)
		}
	}
	if b.Len() == 0 {
		b.WriteString("(no output)\n")
	}
	content := append([]sdk.Content{&sdk.TextContent{Text: b.String()}}, images...)
	return &sdk.CallToolResult{Content: content}, r, nil
}

// formatsOf lists the formats result has, as E2B's SDKs name them.
func formatsOf(r client.CodeResult) []string {
	var f []string
	for _, x := range []struct {
		name string
		set  bool
	}{
		{"text", r.Text != ""}, {"html", r.HTML != ""}, {"markdown", r.Markdown != ""}, {"svg", r.SVG != ""},
		{"png", r.PNG != ""}, {"jpeg", r.JPEG != ""}, {"pdf", r.PDF != ""}, {"latex", r.LaTeX != ""},
		{"json", len(r.JSON) > 0}, {"javascript", r.JavaScript != ""}, {"data", len(r.Data) > 0}, {"chart", len(r.Chart) > 0},
	} {
		if x.set {
			f = append(f, x.name)
		}
	}
	return f
}

func (s *Server) createCodeContext(ctx context.Context, a contextArgs) (*sdk.CallToolResult, contextResult, error) {
	lang, err := codeLanguage(a.Language)
	if err != nil {
		return nil, contextResult{}, err
	}
	if a.Cwd != "" && !strings.HasPrefix(a.Cwd, "/") {
		return nil, contextResult{}, fmt.Errorf("cwd %q: want an absolute path: %w", a.Cwd, errdefs.ErrInvalidArgument)
	}
	if err := checkRef(a.SandboxID); err != nil {
		return nil, contextResult{}, err
	}
	cl, done, err := s.be.code(ctx, a.SandboxID)
	if err != nil {
		return nil, contextResult{}, err
	}
	defer done()
	cc, err := cl.CreateContext(ctx, lang, a.Cwd)
	if err != nil {
		return nil, contextResult{}, codeCallError(a.SandboxID, err)
	}
	r := contextResult{ContextID: cc.ID, Language: cc.Language, Cwd: cc.Cwd}
	return &sdk.CallToolResult{Content: []sdk.Content{&sdk.TextContent{Text: fmt.Sprintf("context_id: %s (%s, in %s)", r.ContextID, r.Language, r.Cwd)}}}, r, nil
}

func (s *Server) restartCodeContext(ctx context.Context, a restartArgs) (*sdk.CallToolResult, restartResult, error) {
	if a.ContextID == "" {
		return nil, restartResult{}, fmt.Errorf("context_id is empty: %w", errdefs.ErrInvalidArgument)
	}
	if err := checkRef(a.SandboxID); err != nil {
		return nil, restartResult{}, err
	}
	cl, done, err := s.be.code(ctx, a.SandboxID)
	if err != nil {
		return nil, restartResult{}, err
	}
	defer done()
	if err := cl.RestartContext(ctx, a.ContextID); err != nil {
		if client.IsNotFound(err) {
			return nil, restartResult{}, fmt.Errorf("sandbox %s has no code context %s: %w", a.SandboxID, a.ContextID, errdefs.ErrNotFound)
		}
		return nil, restartResult{}, codeCallError(a.SandboxID, err)
	}
	r := restartResult{ContextID: a.ContextID, Restarted: true}
	return &sdk.CallToolResult{Content: []sdk.Content{&sdk.TextContent{Text: "restarted " + a.ContextID + ": its variables are gone"}}}, r, nil
}

// codeCallError says what a failed call of the code interpreter means.
func codeCallError(id string, err error) error {
	if noInterpreter(err) {
		return fmt.Errorf("sandbox %s has no code interpreter: create it with image code-interpreter-v1: %w", id, errdefs.ErrFailedPrecondition)
	}
	var ce *client.Error
	if errors.As(err, &ce) && ce.Status == http.StatusBadRequest {
		return fmt.Errorf("%s: %w", ce.Message, errdefs.ErrInvalidArgument)
	}
	return fmt.Errorf("the code interpreter of sandbox %s: %w", id, err)
}
