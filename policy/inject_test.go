package policy

import (
	"errors"
	"strings"
	"testing"
)

func TestParseInject(t *testing.T) {
	for _, c := range []struct {
		in   string
		want InjectRule
		err  string
	}{
		{in: "api.test:Authorization=Bearer ${secret:tok}", want: InjectRule{Host: "api.test", Header: "Authorization", Value: "Bearer ${secret:tok}"}},
		{in: "API.test:X-Key=secret:k1", want: InjectRule{Host: "api.test", Header: "X-Key", Value: "${secret:k1}"}},
		{in: "api.test:env=OPENAI_API_KEY=secret:openai", want: InjectRule{Host: "api.test", Env: "OPENAI_API_KEY", Value: "${secret:openai}"}},
		{in: "api.test:Authorization=Bearer plain", err: "secret:NAME"},
		{in: "*.api.test:X=secret:a", err: "without wildcard"},
		{in: "10.0.0.1:X=secret:a", err: "domain"},
		{in: "api.test:Bad Header=secret:a", err: "not an HTTP header name"},
		{in: "api.test:env=1X=secret:a", err: "variable name"},
		{in: "api.test:X=secret:../a", err: "secret name"},
		{in: "api.test:X=${secret:a}\r\nEvil: 1", err: "characters"},
		{in: "api.test", err: "want HOST:HEADER=VALUE"},
	} {
		r, err := ParseInject(c.in)
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("ParseInject(%q) = %+v, %v; want an error with %q", c.in, r, err, c.err)
			}
			continue
		}
		if err != nil || r != c.want {
			t.Errorf("ParseInject(%q) = %+v, %v; want %+v", c.in, r, err, c.want)
		}
	}
}

func TestInjectResolve(t *testing.T) {
	r, _ := ParseInject("api.test:Authorization=Bearer ${secret:a}-${secret:b}")
	v, err := r.Resolve(func(n string) (string, error) { return strings.ToUpper(n), nil })
	if err != nil || v != "Bearer A-B" {
		t.Fatalf("Resolve = %q, %v", v, err)
	}
	if _, err := r.Resolve(func(string) (string, error) { return "", errors.New("gone") }); err == nil {
		t.Fatal("a missing secret resolved")
	}
}

func TestParseInjectList(t *testing.T) {
	allow, _ := ParseAllowList([]string{"api.test", "web.test:80"})
	if _, err := ParseInjectList([]string{"api.test:X=secret:a"}, NetAllow, allow); err != nil {
		t.Fatal(err)
	}
	if _, err := ParseInjectList([]string{"web.test:X=secret:a"}, NetAllow, allow); err == nil || !strings.Contains(err.Error(), "port 443") {
		t.Fatalf("inject to a host not allowed on 443: %v", err)
	}
	if _, err := ParseInjectList([]string{"api.test:X=secret:a"}, NetOpen, allow); err == nil || !strings.Contains(err.Error(), "--net allow") {
		t.Fatalf("inject in open mode: %v", err)
	}
}
