// Command hutch-node is the Kubernetes side of hutch's node installer (the
// DaemonSet in deploy/kubernetes/daemonset.yaml): it tells whether the
// node's container runtime reports a runtime handler, waits for one to come
// or go, and sets or removes a label of the node. It talks to the API server
// with the pod's service account, using only the standard library.
//
//	hutch-node has-handler NAME              exit 0 if the node reports handler NAME, 1 if not, 3 on error
//	hutch-node wait-handler NAME present|absent TIMEOUT
//	hutch-node label KEY=VALUE               set a label of the node
//	hutch-node label KEY-                    remove it
//	hutch-node serve --key-file FILE [--listen ADDR] [--containerd SOCKET] [--checkpoint-dir DIR] [--host-root DIR]
//	                                       run the node service (package kubenode/nodesvc)
//
// serve needs neither the node's name nor the API server: it answers
// hutch serve's checkpoint requests until SIGTERM. FILE holds the node key,
// 64 hex digits, which hutch serve holds too.
//
// The node is $NODE_NAME. The API server is $HUTCH_KUBE_API when set (a URL;
// for nodes where the kubernetes Service's address is not reachable from the
// host's network, for example a cluster without kube-proxy), else
// https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT.
package main

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"slices"
	"strings"
	"time"
)

const saDir = "/var/run/secrets/kubernetes.io/serviceaccount"

// errUsage marks a command line hutch-node does not understand.
var errUsage = errors.New("usage: hutch-node has-handler NAME | wait-handler NAME present|absent TIMEOUT | label KEY=VALUE | label KEY- | serve --key-file FILE [--listen ADDR] [--containerd SOCKET] [--checkpoint-dir DIR] [--host-root DIR]")

func main() {
	code, err := run(os.Args[1:])
	if err != nil {
		fmt.Fprintln(os.Stderr, "hutch-node:", err)
	}
	os.Exit(code)
}

func run(args []string) (int, error) {
	if len(args) == 0 {
		return 2, errUsage
	}
	if args[0] == "serve" {
		return serve(args[1:])
	}
	c, err := newClient()
	if err != nil {
		return 3, err
	}
	switch {
	case args[0] == "has-handler" && len(args) == 2:
		ok, err := c.hasHandler(args[1])
		if err != nil {
			return 3, err
		}
		if !ok {
			return 1, nil
		}
		return 0, nil
	case args[0] == "wait-handler" && len(args) == 4 && (args[2] == "present" || args[2] == "absent"):
		d, err := time.ParseDuration(args[3])
		if err != nil {
			return 2, fmt.Errorf("wait-handler timeout %q: %w", args[3], err)
		}
		return 0, c.waitHandler(args[1], args[2] == "present", d)
	case args[0] == "label" && len(args) == 2:
		return 0, c.label(args[1])
	}
	return 2, errUsage
}

// client is the API server as the pod's service account.
type client struct {
	http        *http.Client
	api, node   string
	tokenHeader string
}

func newClient() (*client, error) {
	node := os.Getenv("NODE_NAME")
	if node == "" {
		return nil, errors.New("NODE_NAME is not set (the DaemonSet sets it from spec.nodeName)")
	}
	api := os.Getenv("HUTCH_KUBE_API")
	if api == "" {
		h, p := os.Getenv("KUBERNETES_SERVICE_HOST"), os.Getenv("KUBERNETES_SERVICE_PORT")
		if h == "" || p == "" {
			return nil, errors.New("neither HUTCH_KUBE_API nor KUBERNETES_SERVICE_HOST/PORT is set: not in a pod?")
		}
		api = "https://" + net.JoinHostPort(h, p)
	}
	token, err := os.ReadFile(saDir + "/token")
	if err != nil {
		return nil, fmt.Errorf("service account token: %w", err)
	}
	ca, err := os.ReadFile(saDir + "/ca.crt")
	if err != nil {
		return nil, fmt.Errorf("service account CA: %w", err)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(ca) {
		return nil, fmt.Errorf("service account CA %s/ca.crt: no certificate", saDir)
	}
	return &client{
		http:        &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots}}},
		api:         strings.TrimRight(api, "/"),
		node:        node,
		tokenHeader: "Bearer " + strings.TrimSpace(string(token)),
	}, nil
}

// do sends one request for the node and decodes a JSON answer into out.
func (c *client) do(method, contentType string, body []byte, out any) error {
	req, err := http.NewRequest(method, c.api+"/api/v1/nodes/"+c.node, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", c.tokenHeader)
	req.Header.Set("Accept", "application/json")
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("%s node %s: %s: %s", method, c.node, resp.Status, bytes.TrimSpace(b))
	}
	if out != nil {
		return json.Unmarshal(b, out)
	}
	return nil
}

// runtimeHandler is what hutch-node reads of a node's status.runtimeHandlers.
type runtimeHandler struct {
	Name string `json:"name"`
}

// hasHandler reports whether the node's status lists the runtime handler
// (the kubelet copies it from the container runtime's status).
func (c *client) hasHandler(name string) (bool, error) {
	var n struct {
		Status struct {
			RuntimeHandlers []runtimeHandler `json:"runtimeHandlers"`
		} `json:"status"`
	}
	if err := c.do(http.MethodGet, "", nil, &n); err != nil {
		return false, err
	}
	return slices.ContainsFunc(n.Status.RuntimeHandlers, func(h runtimeHandler) bool { return h.Name == name }), nil
}

func (c *client) waitHandler(name string, present bool, d time.Duration) error {
	var last error
	for deadline := time.Now().Add(d); time.Now().Before(deadline); time.Sleep(2 * time.Second) {
		ok, err := c.hasHandler(name)
		if err == nil && ok == present {
			return nil
		}
		last = err
	}
	state := "reported"
	if !present {
		state = "gone"
	}
	if last != nil {
		return fmt.Errorf("runtime handler %q of node %s not %s within %s: %w", name, c.node, state, d, last)
	}
	return fmt.Errorf("runtime handler %q of node %s not %s within %s (has containerd loaded its configuration?)", name, c.node, state, d)
}

// label sets KEY=VALUE or removes KEY- with a JSON merge patch.
func (c *client) label(arg string) error {
	var value any
	key, v, ok := strings.Cut(arg, "=")
	switch {
	case ok && key != "":
		value = v
	case !ok && strings.HasSuffix(arg, "-") && len(arg) > 1:
		key = strings.TrimSuffix(arg, "-")
	default:
		return fmt.Errorf("label %q: want KEY=VALUE or KEY-: %w", arg, errUsage)
	}
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"labels": map[string]any{key: value}}})
	if err != nil {
		return err
	}
	return c.do(http.MethodPatch, "application/merge-patch+json", patch, nil)
}
