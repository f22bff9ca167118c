// Package shim is hutch's containerd runtime v2 shim (io.containerd.hutch.v1):
// the task API (ttrpc, v3) implemented on runsc and policy, with
// containerd's own shim library doing the process plumbing.
//
// One shim process serves one pod. The pod's sandbox container (CRI's
// pause container, or a lone `ctr run` container) boots a gVisor sandbox;
// containers whose spec names that sandbox (io.kubernetes.cri.sandbox-id)
// join it, so they share one gVisor kernel, one network stack and
// localhost. The pod's hutch policy (network mode and allow rules, DNS,
// disk) comes from the dev.hutch.* annotations over the runtime options file
// and is validated by policy before anything is created.
//
// It must not exec runsc (runsc does), decide policy (policy
// does), or print for humans: errors go to containerd as gRPC errors.
package shim
