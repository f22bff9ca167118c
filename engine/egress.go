package engine

import (
	"context"
	"crypto/rand"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"path/filepath"
	"slices"

	"hutch.dev/hutch/assembly"
	"hutch.dev/hutch/egress"
	"hutch.dev/hutch/policy"
)

// EgressEntry is one connection in a sandbox's egress log.
type EgressEntry = egress.Entry

// EgressLog returns sandbox ref's egress log, oldest first: every web
// connection its gateway judged, with the decision and the rule that made
// it. A sandbox whose web connections never met a gateway (no network,
// rootless, never in mode allow) has none.
func (e *Engine) EgressLog(ctx context.Context, ref string) ([]EgressEntry, error) {
	sb, err := e.get(ctx, ref)
	if err != nil {
		return nil, err
	}
	return egress.ReadLog(assembly.EgressLogPath(e.sandboxDir(sb.ID)))
}

// gatewayCAPath is the file of a sandbox's gateway CA, certificate and
// key, in its state directory dir: removed with it.
func gatewayCAPath(dir string) string { return filepath.Join(dir, "egress-ca.pem") }

// prepareInject gives the new sandbox its inject rules: a placeholder per
// env rule, in the variable it names, and a CA of its own, which it
// trusts, for the gateway to terminate TLS to their hosts with.
func (c *creation) prepareInject(rules []policy.InjectRule) error {
	if len(rules) == 0 {
		return nil
	}
	for i := range rules {
		if rules[i].Env == "" {
			continue
		}
		b := make([]byte, 24)
		if _, err := rand.Read(b); err != nil {
			return err
		}
		rules[i].Placeholder = "hutch-placeholder-" + hex.EncodeToString(b)
		c.sb.Env = append(c.sb.Env, rules[i].Env+"="+rules[i].Placeholder)
	}
	c.sb.Inject = rules
	var hosts []string
	for _, r := range rules {
		if !slices.Contains(hosts, r.Host) {
			hosts = append(hosts, r.Host)
		}
	}
	certPEM, bundle, err := egress.NewCA(c.sb.ID, hosts)
	if err != nil {
		return err
	}
	blk, _ := pem.Decode(certPEM)
	cert, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		return err
	}
	c.cas = append(c.cas, cert)
	c.gatewayCA = bundle
	return nil
}

// injectViews renders rules as --inject gave them.
func injectViews(rules []policy.InjectRule) []string {
	var out []string
	for _, r := range rules {
		if r.Env != "" {
			out = append(out, r.Host+":env="+r.Env+"="+r.Value)
		} else {
			out = append(out, r.Host+":"+r.Header+"="+r.Value)
		}
	}
	return out
}
