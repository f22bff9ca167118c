//go:build tools

// Package k8s pins the Kubernetes release whose binaries the Kubernetes
// end-to-end tests run (make k8s-tools). It lives in its own module so that
// Kubernetes' dependency pins never meet the main module's.
package k8s

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubectl"
	_ "k8s.io/kubernetes/cmd/kubelet"
)
