package serve

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"
)

const monitoringDir = "../deploy/monitoring"

// promtool is Prometheus's own checker of rules (Debian's prometheus).
func promtool(t *testing.T, dir string, args ...string) {
	t.Helper()
	bin, err := exec.LookPath("promtool")
	if err != nil {
		t.Fatal("promtool is not installed: scripts/install-deps.sh installs Debian's prometheus, which has it")
	}
	cmd := exec.Command(bin, args...)
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// TestMonitoring checks deploy/monitoring with Prometheus's promtool: the
// alert rules parse, and each fires on the series its test gives and
// not on healthy ones; every query of the Grafana dashboard parses; and
// every metric either names is one the server serves.
func TestMonitoring(t *testing.T) {
	promtool(t, monitoringDir, "check", "rules", "alerts.yml")
	promtool(t, monitoringDir, "test", "rules", "alerts_test.yml")

	b, err := os.ReadFile(filepath.Join(monitoringDir, "dashboard.json"))
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(b, &dash); err != nil {
		t.Fatalf("dashboard.json: %v", err)
	}
	// Each query as a recording rule, Grafana's variables given values,
	// for promtool to parse.
	grafana := strings.NewReplacer("$__rate_interval", "5m", "$instance", ".*")
	var rules strings.Builder
	rules.WriteString("groups:\n  - name: dashboard\n    rules:\n")
	var exprs []string
	for i, p := range dash.Panels {
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for j, q := range p.Targets {
			exprs = append(exprs, q.Expr)
			e, _ := json.Marshal(grafana.Replace(q.Expr))
			fmt.Fprintf(&rules, "      - record: dashboard:panel%d:%d\n        expr: %s\n", i, j, e)
		}
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "dashboard-rules.yml"), []byte(rules.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	promtool(t, dir, "check", "rules", "dashboard-rules.yml")

	// The names the server serves, each of its series made once.
	m := newMetrics()
	m.observe("api", "GET", 200, time.Millisecond)
	m.created("t", time.Second)
	m.resumed("t", time.Second)
	m.sandboxes = func(context.Context) (map[[2]string]int, error) {
		return map[[2]string]int{{"t", "running"}: 1}, nil
	}
	families, err := m.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	served := map[string]bool{}
	for _, f := range families {
		name := f.GetName()
		served[name] = true
		for _, suffix := range []string{"_bucket", "_count", "_sum"} {
			served[name+suffix] = true
		}
	}
	alerts, err := os.ReadFile(filepath.Join(monitoringDir, "alerts.yml"))
	if err != nil {
		t.Fatal(err)
	}
	metric := regexp.MustCompile(`\b(?:hutch|process|go)_[a-z_]+\b`)
	var unknown []string
	for _, text := range append(exprs, string(alerts)) {
		for _, name := range metric.FindAllString(text, -1) {
			if !served[name] {
				unknown = append(unknown, name)
			}
		}
	}
	sort.Strings(unknown)
	if len(unknown) > 0 {
		t.Errorf("deploy/monitoring names metrics the server does not serve: %v", unknown)
	}
}
