package serve

import (
	"strings"
	"testing"

	"github.com/urfave/cli/v2"
)

// TestBackend checks which backend each combination of flags selects and
// that a bad one names the flag at fault.
func TestBackend(t *testing.T) {
	for _, tc := range []struct {
		args    []string
		want    string
		wantErr string // a substring of the error; "" for none
	}{
		{args: nil, want: backendLocal},
		{args: []string{"--backend", "local"}, want: backendLocal},
		{args: []string{"--kubeconfig", "kc"}, want: backendKubernetes},
		{args: []string{"--backend", "kubernetes", "--kubeconfig", "kc", "--namespace", "ns"}, want: backendKubernetes},
		{args: []string{"--backend", "kubernetes"}, wantErr: "--kubeconfig"},
		{args: []string{"--backend", "kubernetes", "--namespace", "ns"}, wantErr: "--kubeconfig"},
		{args: []string{"--backend", "local", "--kubeconfig", "kc"}, wantErr: "--kubeconfig"},
		{args: []string{"--namespace", "ns"}, wantErr: "--namespace"},
		{args: []string{"--template", "base=busybox"}, wantErr: "--template"},
		{args: []string{"--pod-memory", "1g"}, wantErr: "--pod-memory"},
		{args: []string{"--runtime-class", "other"}, wantErr: "--runtime-class"},
		{args: []string{"--backend", "kube", "--kubeconfig", "kc"}, wantErr: `--backend "kube"`},
	} {
		var got string
		var err error
		app := &cli.App{Flags: Command.Flags, Action: func(c *cli.Context) error {
			got, err = backend(c)
			return nil
		}}
		if rerr := app.Run(append([]string{"serve"}, tc.args...)); rerr != nil {
			t.Fatalf("%q: %v", tc.args, rerr)
		}
		switch {
		case tc.wantErr == "" && (err != nil || got != tc.want):
			t.Errorf("%q: backend %q, error %v; want %q", tc.args, got, err, tc.want)
		case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
			t.Errorf("%q: backend %q, error %v; want an error naming %s", tc.args, got, err, tc.wantErr)
		}
	}
}
