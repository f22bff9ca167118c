// Package kubeplace places `hutch serve`'s sandboxes on a Kubernetes
// cluster (serve.Config.Kube): it implements placement.Placement, and the
// server then runs no sandbox itself. Each sandbox is a pod with the
// hutch RuntimeClass (gVisor through hutch's shim on whichever node the
// cluster's scheduler picks), whose one container runs the agent
// (hutch-init, which the shim mounts into every pod) as its init.
// Everything the server knows of a sandbox is on its pod, in labels (what
// selects: manager, tenant, sandbox ID) and annotations (template,
// metadata, deadline), and its agent's key in a Secret the pod owns: a
// restarted server, or another one on the same namespace, finds every
// sandbox again. Commands and files reach a sandbox through its agent's
// authenticated endpoint on the pod network (agent.go), or the pods/exec
// subresource for a sandbox without network, running the same agent
// modes the engine runs through runsc exec. The client of the cluster's
// API server is package serve/kube.
package kubeplace
