package policy

import (
	"fmt"
	"net/netip"
	"regexp"
	"strings"

	"github.com/containerd/errdefs"
	"golang.org/x/net/http/httpguts"
)

// InjectRule is one --inject entry: the egress gateway terminates TLS to
// Host and, on every request to it, sets Header to Value, or (Env) replaces
// the placeholder the sandbox holds in its variable Env by Value wherever
// a header holds it. Value is a template over the host's secret store
// (SecretRefs); the sandbox never holds what it resolves to.
type InjectRule struct {
	Host   string `json:"host"`
	Header string `json:"header,omitempty"`
	Env    string `json:"env,omitempty"`
	Value  string `json:"value"`
	// Placeholder is what the sandbox's Env holds instead of the value:
	// random per sandbox, set by the engine.
	Placeholder string `json:"placeholder,omitempty"`
}

// secretRef matches ${secret:NAME} in an --inject value.
var secretRef = regexp.MustCompile(`\$\{secret:([^}]*)\}`)

// secretName is what a secret store's name may be.
var secretName = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$`)

// CheckSecretName validates the name of a secret in the host's store.
func CheckSecretName(name string) error {
	if !secretName.MatchString(name) {
		return fmt.Errorf("secret name %q: want letters, digits, '_', '.' and '-', starting with a letter or digit, at most 128: %w", name, errdefs.ErrInvalidArgument)
	}
	return nil
}

// ParseInject parses HOST:HEADER=VALUE or HOST:env=VAR=VALUE, where VALUE
// is secret:NAME (the whole value) or holds ${secret:NAME} references.
func ParseInject(s string) (InjectRule, error) {
	bad := func(why string) (InjectRule, error) {
		return InjectRule{}, fmt.Errorf("%w: --inject %q: %s", errdefs.ErrInvalidArgument, s, why)
	}
	host, rest, ok := strings.Cut(s, ":")
	if !ok {
		return bad("want HOST:HEADER=VALUE or HOST:env=VAR=VALUE")
	}
	host = strings.ToLower(strings.TrimSuffix(host, "."))
	if _, err := netip.ParseAddr(host); err == nil {
		return bad("HOST must be a domain name, not an address")
	}
	if err := checkDomain(host); err != nil || strings.Contains(host, "*") {
		return bad("HOST must be a domain name, without wildcard")
	}
	r := InjectRule{Host: host}
	name, value, ok := strings.Cut(rest, "=")
	if !ok || name == "" {
		return bad("want HOST:HEADER=VALUE or HOST:env=VAR=VALUE")
	}
	if name == "env" {
		if r.Env, value, ok = strings.Cut(value, "="); !ok || !envName.MatchString(r.Env) {
			return bad("env=VAR=VALUE needs a variable name (letters, digits, '_')")
		}
	} else {
		if !httpguts.ValidHeaderFieldName(name) {
			return bad(fmt.Sprintf("%q is not an HTTP header name", name))
		}
		r.Header = name
	}
	if n, ok := strings.CutPrefix(value, "secret:"); ok {
		value = "${secret:" + n + "}"
	}
	r.Value = value
	refs := r.SecretRefs()
	if len(refs) == 0 {
		return bad("VALUE must be secret:NAME or hold ${secret:NAME}: a value the sandbox may know needs no injection")
	}
	for _, n := range refs {
		if err := CheckSecretName(n); err != nil {
			return bad(err.Error())
		}
	}
	if !httpguts.ValidHeaderFieldValue(secretRef.ReplaceAllString(value, "x")) {
		return bad("VALUE holds characters a header may not")
	}
	return r, nil
}

var envName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// SecretRefs are the names of the secrets r's value refers to.
func (r InjectRule) SecretRefs() []string {
	var out []string
	for _, m := range secretRef.FindAllStringSubmatch(r.Value, -1) {
		out = append(out, m[1])
	}
	return out
}

// Resolve renders r's value with the secrets lookup returns.
func (r InjectRule) Resolve(lookup func(name string) (string, error)) (string, error) {
	var err error
	v := secretRef.ReplaceAllStringFunc(r.Value, func(m string) string {
		s, lerr := lookup(secretRef.FindStringSubmatch(m)[1])
		if lerr != nil && err == nil {
			err = lerr
		}
		return s
	})
	return v, err
}

// ParseInjectList parses every --inject entry and checks them against the
// sandbox's network: mode allow, with a rule allowing each host on 443
// (the gateway terminates TLS only for what it would let through).
func ParseInjectList(entries []string, mode string, allow []AllowRule) ([]InjectRule, error) {
	var out []InjectRule
	for _, e := range entries {
		r, err := ParseInject(e)
		if err != nil {
			return nil, err
		}
		if mode != NetAllow {
			return nil, fmt.Errorf("%w: --inject needs --net allow: the egress gateway judges and injects only there", errdefs.ErrInvalidArgument)
		}
		if d := DecideWeb(allow, r.Host, 443); !d.Allowed {
			return nil, fmt.Errorf("%w: --inject %q: no --allow rule allows %s on port 443", errdefs.ErrInvalidArgument, e, r.Host)
		}
		out = append(out, r)
	}
	return out, nil
}
