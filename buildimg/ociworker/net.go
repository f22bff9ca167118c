package ociworker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"hutch.dev/hutch/policy"
)

// StepNetwork is a build step's network as the supervisor made it, what
// POST StepPath(id) on its socket answers.
type StepNetwork struct {
	// Netns is the namespace the step's sandbox runs in.
	Netns string `json:"netns"`
	// ResolvConf is the file that names the step's resolver.
	ResolvConf string `json:"resolvConf"`
}

// StepPath is the supervisor's path for the network of step id: POST
// makes it (StepNetwork), DELETE removes it (and succeeds when there is
// none).
func StepPath(id string) string { return "/steps/" + id }

var stepIDRE = regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9_.-]{0,127}$`)

// ValidStepID reports whether id can name a step's network: BuildKit's
// container IDs are short and plain.
func ValidStepID(id string) bool { return stepIDRE.MatchString(id) }

// caBundle is where a step's image keeps its CA bundle, and where the
// host's is put over it.
const caBundle = "/etc/ssl/certs/ca-certificates.crt"

// network does what a step with network needs before runsc runs it: for
// run and create of a step that did not ask for none, a network from the
// supervisor, named in the step's spec, and --network=sandbox; for
// delete, the step's network given back.
func (c Config) network(args []string, sub, id string) ([]string, error) {
	switch sub {
	case "delete":
		if id != "" {
			if _, err := c.call(http.MethodDelete, id); err != nil {
				return nil, fmt.Errorf("removing step %s's network: %w", id, err)
			}
		}
		return args, nil
	case "run", "create":
	default:
		return args, nil
	}
	id = args[len(args)-1]
	bundle := "."
	for i, a := range args {
		if (a == "--bundle" || a == "-b") && i+1 < len(args) {
			bundle = args[i+1]
		} else if v, ok := strings.CutPrefix(a, "--bundle="); ok {
			bundle = v
		}
	}
	cfgPath := filepath.Join(bundle, "config.json")
	b, err := os.ReadFile(cfgPath)
	if err != nil {
		return nil, err
	}
	var spec specs.Spec
	if err := json.Unmarshal(b, &spec); err != nil {
		return nil, fmt.Errorf("%s: %w", cfgPath, err)
	}
	if spec.Linux == nil || hasNetns(&spec) {
		// RUN --network=none: BuildKit asks for a namespace of
		// the step's own, which runsc's --network=none gives.
		return args, nil
	}
	n, err := c.call(http.MethodPost, id)
	if err != nil {
		return nil, fmt.Errorf("step %s's network: %w", id, err)
	}
	rootfs := ""
	if spec.Root != nil {
		rootfs = spec.Root.Path
		if !filepath.IsAbs(rootfs) {
			rootfs = filepath.Join(bundle, rootfs)
		}
	}
	c.attach(&spec, n, rootfs)
	out, err := json.Marshal(&spec)
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(cfgPath, out, 0o600); err != nil {
		return nil, err
	}
	for i, a := range args {
		if a == "--network=none" {
			args[i] = "--network=sandbox"
		}
	}
	return args, nil
}

func hasNetns(s *specs.Spec) bool {
	for _, ns := range s.Linux.Namespaces {
		if ns.Type == specs.NetworkNamespace {
			return true
		}
	}
	return false
}

// attach puts network n into spec: its namespace, its resolv.conf over
// the one BuildKit made, and, with c.CABundle and an image that has a
// bundle at caBundle, the host's bundle over it, named by policy.CAEnv
// for the programs that read a variable. An image without one keeps its
// own trust: a mount point made in the step would end up in its layer.
func (c Config) attach(spec *specs.Spec, n *StepNetwork, rootfs string) {
	spec.Linux.Namespaces = append(spec.Linux.Namespaces, specs.LinuxNamespace{Type: specs.NetworkNamespace, Path: n.Netns})
	found := false
	for i, m := range spec.Mounts {
		if m.Destination == "/etc/resolv.conf" {
			spec.Mounts[i].Source, spec.Mounts[i].Type = n.ResolvConf, "bind"
			spec.Mounts[i].Options = []string{"rbind", "ro"}
			found = true
		}
	}
	if !found {
		spec.Mounts = append(spec.Mounts, specs.Mount{Destination: "/etc/resolv.conf", Type: "bind", Source: n.ResolvConf, Options: []string{"rbind", "ro"}})
	}
	if c.CABundle == "" || rootfs == "" || !plainFile(rootfs, caBundle) {
		return
	}
	spec.Mounts = append(spec.Mounts, specs.Mount{Destination: caBundle, Type: "bind", Source: c.CABundle, Options: []string{"rbind", "ro"}})
	if spec.Process != nil {
		spec.Process.Env = append(spec.Process.Env, policy.CAEnvFor(caBundle)...)
	}
}

// plainFile reports whether p (absolute, in the image) is a regular file
// under rootfs reached through directories only: no symbolic link on the
// way, which the host would resolve otherwise than the step.
func plainFile(rootfs, p string) bool {
	cur := rootfs
	parts := strings.Split(strings.TrimPrefix(p, "/"), "/")
	for i, part := range parts {
		cur = filepath.Join(cur, part)
		fi, err := os.Lstat(cur)
		if err != nil {
			return false
		}
		if i < len(parts)-1 && !fi.IsDir() || i == len(parts)-1 && !fi.Mode().IsRegular() {
			return false
		}
	}
	return true
}

// call asks the supervisor to make (POST) or remove (DELETE) step id's
// network.
func (c Config) call(method, id string) (*StepNetwork, error) {
	if !ValidStepID(id) {
		return nil, fmt.Errorf("step ID %q cannot name a network", id)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	hc := &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) { return DialUnix(ctx, c.Net) },
	}}
	req, err := http.NewRequestWithContext(ctx, method, "http://supervisor"+StepPath(id), nil)
	if err != nil {
		return nil, err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if resp.StatusCode/100 != 2 {
		return nil, errors.New(strings.TrimSpace(string(body)))
	}
	if method != http.MethodPost {
		return nil, nil
	}
	var n StepNetwork
	if err := json.Unmarshal(body, &n); err != nil || n.Netns == "" || n.ResolvConf == "" {
		return nil, fmt.Errorf("the supervisor's answer %q names no network", body)
	}
	return &n, nil
}

// DialUnix connects to the unix socket at path. A path too long for a
// socket address is reached through /proc's name for a descriptor of the
// socket file.
func DialUnix(ctx context.Context, path string) (net.Conn, error) {
	var dialer net.Dialer
	if len(path) < len(unix.RawSockaddrUnix{}.Path) {
		return dialer.DialContext(ctx, "unix", path)
	}
	fd, err := unix.Open(path, unix.O_PATH|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &os.PathError{Op: "dial", Path: path, Err: err}
	}
	defer unix.Close(fd)
	return dialer.DialContext(ctx, "unix", "/proc/self/fd/"+strconv.Itoa(fd))
}
