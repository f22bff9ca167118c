package client

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// A code interpreter's answer, line by line, is an Execution in order;
// keepalives and unknown lines are skipped; an answer that ends before
// end_of_execution is an error; a 4xx carries the server's message.
func TestCodeExecute(t *testing.T) {
	var got map[string]any
	answer := ""
	status := http.StatusOK
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/execute" || r.Method != http.MethodPost || r.Header.Get("X-Access-Token") != "tok" {
			http.Error(w, "bad request line or headers", http.StatusTeapot)
			return
		}
		b, _ := io.ReadAll(r.Body)
		json.Unmarshal(b, &got) //nolint:errcheck // checked below
		w.WriteHeader(status)
		io.WriteString(w, answer) //nolint:errcheck // the test reads it
	}))
	defer srv.Close()
	c := &Code{BaseURL: srv.URL, Header: http.Header{"X-Access-Token": {"tok"}}}

	answer = strings.Join([]string{
		`{"type": "number_of_executions", "execution_count": 3}`,
		`{"type": "stdout", "text": "hi\n", "timestamp": "2026-01-01T00:00:00Z"}`,
		`{"type": "keepalive"}`,
		`{"type": "stderr", "text": "warn\n"}`,
		`{"type": "result", "png": "iVBO", "chart": {"type": "line"}, "extra": {}, "is_main_result": false}`,
		`{"type": "something_new"}`,
		`{"type": "result", "text": "42", "data": {"a": [1]}, "is_main_result": true}`,
		`{"type": "error", "name": "ValueError", "value": "boom", "traceback": "tb"}`,
		`{"type": "end_of_execution"}`,
		`{"type": "stdout", "text": "after the end"}`,
	}, "\n") + "\n"
	var kinds []string
	x, err := c.Execute(context.Background(), CodeRequest{Code: "1", Language: "python", EnvVars: map[string]string{"A": "b"}}, func(o CodeOutput) {
		kinds = append(kinds, o.Type)
	})
	if err != nil {
		t.Fatal(err)
	}
	if got["code"] != "1" || got["language"] != "python" || got["context_id"] != nil || got["env_vars"].(map[string]any)["A"] != "b" {
		t.Errorf("request body %v", got)
	}
	if strings.Join(kinds, ",") != "number_of_executions,stdout,stderr,result,result,error" {
		t.Errorf("outputs %v", kinds)
	}
	if x.ExecutionCount != 3 || strings.Join(x.Stdout, "") != "hi\n" || strings.Join(x.Stderr, "") != "warn\n" {
		t.Errorf("execution %+v", x)
	}
	if len(x.Results) != 2 || x.Text() != "42" || x.Results[0].PNG != "iVBO" || string(x.Results[0].Chart) != `{"type": "line"}` || string(x.Results[1].Data) != `{"a": [1]}` {
		t.Errorf("results %+v", x.Results)
	}
	if x.Error == nil || x.Error.Name != "ValueError" || x.Error.Value != "boom" || x.Error.Traceback != "tb" {
		t.Errorf("error %+v", x.Error)
	}

	answer = `{"type": "stdout", "text": "cut"}` + "\n"
	if _, err := c.Execute(context.Background(), CodeRequest{Code: "1"}, nil); err == nil || !strings.Contains(err.Error(), "end_of_execution") {
		t.Errorf("an answer without its end: %v", err)
	}
	answer = "not json\n"
	if _, err := c.Execute(context.Background(), CodeRequest{Code: "1"}, nil); err == nil || !strings.Contains(err.Error(), "not JSON") {
		t.Errorf("a line that is not JSON: %v", err)
	}
	status, answer = http.StatusNotFound, "Context abc not found"
	_, err = c.Execute(context.Background(), CodeRequest{Code: "1", ContextID: "abc"}, nil)
	if !IsNotFound(err) || !strings.Contains(err.Error(), "Context abc not found") {
		t.Errorf("a 404: %v", err)
	}
}

func TestIsLanguage(t *testing.T) {
	for name, want := range map[string]bool{
		"python": true, "Py": true, "js": true, "javascript": true, "TS": true, "bash": true, "sh": true,
		"cobol": false, "": false, "r": false,
	} {
		if IsLanguage(name) != want {
			t.Errorf("IsLanguage(%q) = %v, want %v", name, !want, want)
		}
	}
}
