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
// With Config.Kube it places sandboxes on a Kubernetes cluster instead, one
// pod each, and reaches them through the agent's authenticated endpoint on
// the pod network, or through the API server's pods/exec for sandboxes
// without network (kube_place.go, kube_exec.go, kube_agent.go, package
// serve/kube); it then uses no engine at all.
package serve
