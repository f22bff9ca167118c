// Package serve is `hutch serve`: an HTTP server that speaks E2B's API (its
// REST control plane and its envd data plane: the process and filesystem
// Connect services and /files) over hutch's engine, for many tenants on one
// host.
//
// It uses engine's public Go API only: it never execs runsc, builds a spec
// or touches a sandbox's files on the host. Every sandbox it creates carries
// its tenant in a label, and every lookup checks it: another tenant's
// sandbox answers exactly as an unknown one does.
//
// The handlers decode and check each call once and act through one
// interface, placement.Placement (package serve/placement): on this host
// over the engine (host.go), or, with Config.Kube, on a Kubernetes
// cluster, one pod each, reached through the agent's authenticated
// endpoint on the pod network or the API server's pods/exec (package
// serve/kubeplace, over the client in serve/kube); it then uses no engine
// at all. New is the one place that chooses; a call a placement cannot do
// answers 501 through the error it returns.
package serve
