package k8s

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"hutch.dev/hutch/assembly/hostnet"
)

// The tests in this file change the operator's policy, so they run one at
// a time, before the parallel tests, and put the policy back.

func setPolicy(t *testing.T, policy string) {
	t.Helper()
	if err := cl.setPolicy(policy); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cl.setPolicy("") }) //nolint:errcheck // the next test sets its own
}

// hutch's annotations tighten the operator's ceiling; a pod asking above it
// is refused, with the reason in its events.
func TestAnnotationsUnderCeiling(t *testing.T) {
	setPolicy(t, "memory = \"512m\"\ndisk = \"1g\"")

	createPod(t, "greedy", podYAML("greedy", map[string]string{"dev.hutch.memory": "1g"}, "  containers:\n"+
		container("main", "exec sleep 3600", "")))
	createPod(t, "modest", podYAML("modest", map[string]string{"dev.hutch.memory": "256m", "dev.hutch.disk": "64m"}, "  containers:\n"+
		container("main", "exec sleep 3600", "")))

	waitEvent(t, "greedy", `hutch policy: annotation dev.hutch.memory="1g" exceeds the operator's ceiling`, 2*time.Minute)
	if p := getPod(t, "greedy"); p.Status.Phase != "Pending" {
		t.Fatalf("pod above the ceiling is %s, want Pending", p.Status.Phase)
	}

	waitPod(t, "modest", 3*time.Minute, "running", running)
	// The writable layer is bounded by dev.hutch.disk (checked first: the
	// memory bomb below may end the pod).
	out, err := cl.kubectl(nil, "exec", "modest", "--", "dd", "if=/dev/zero", "of=/big", "bs=1M", "count=128")
	if err == nil || !strings.Contains(out+err.Error(), "No space left") {
		t.Errorf("writing 128 MiB under dev.hutch.disk=64m: want ENOSPC, got %q, %v", out, err)
	}
	// The pod's memory is bounded by dev.hutch.memory: a 512 MiB string
	// (1 GiB while it doubles) cannot be held in 256 MiB.
	out, err = cl.kubectl(nil, "exec", "modest", "--", "sh", "-c",
		"x=0123456789abcdef; i=0; while [ $i -lt 25 ]; do x=$x$x; i=$((i+1)); done; echo survived ${#x}")
	if strings.Contains(out, "survived") {
		t.Errorf("a pod with dev.hutch.memory=256m held 512 MiB: %q, %v", out, err)
	}
}

// Network modes: a pod keeps Kubernetes' network (CNI) unless it tightens
// it to none; with an operator's open ceiling a pod gets hutch's own
// network, which denies the host; a hostNetwork pod is refused unless it
// names a hutch network.
func TestNetworkModes(t *testing.T) {
	// A server on the node, on the pod network's gateway address (the host
	// side of each CNI veth).
	ln, err := net.Listen("tcp", ":0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { fmt.Fprint(w, "node-reached") })}
	go srv.Serve(ln) //nolint:errcheck // ends with Close
	defer srv.Close()
	gw := "http://" + net.JoinHostPort(podGateway, strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)) + "/"
	fetch := func(name string) (string, error) {
		// busybox wget -T crashes (SIGSEGV) in these pods: timeout instead.
		return cl.kubectl(nil, "exec", name, "--", "timeout", "5", "wget", "-qO-", gw)
	}
	ifaces := func(name string) string {
		return kubectl(t, "exec", name, "--", "cat", "/proc/net/dev")
	}

	t.Run("cni-and-none", func(t *testing.T) {
		createPod(t, "net-cni", podYAML("net-cni", nil, "  containers:\n"+container("main", "exec sleep 3600", "")))
		createPod(t, "net-none", podYAML("net-none", map[string]string{"dev.hutch.network": "none"}, "  containers:\n"+container("main", "exec sleep 3600", "")))
		createPod(t, "net-open-refused", podYAML("net-open-refused", map[string]string{"dev.hutch.network": "open"}, "  containers:\n"+container("main", "exec sleep 3600", "")))
		waitPod(t, "net-cni", 3*time.Minute, "running", running)
		waitPod(t, "net-none", 3*time.Minute, "running", running)

		if out, err := fetch("net-cni"); err != nil || strings.TrimSpace(out) != "node-reached" {
			t.Fatalf("pod on the CNI network to the node: %q, %v", out, err)
		}
		if !strings.Contains(ifaces("net-cni"), "eth0") {
			t.Fatalf("pod on the CNI network has no eth0: %s", ifaces("net-cni"))
		}
		if d := ifaces("net-none"); strings.Contains(d, "eth0") {
			t.Fatalf("pod with dev.hutch.network=none has interfaces besides lo:\n%s", d)
		}
		if out, err := fetch("net-none"); err == nil {
			t.Fatalf("pod with dev.hutch.network=none reached the node: %q", out)
		}
		waitEvent(t, "net-open-refused", `annotation dev.hutch.network="open" exceeds the operator's ceiling`, 2*time.Minute)
	})

	t.Run("host-network", func(t *testing.T) {
		createPod(t, "net-host", podYAML("net-host", nil, "  hostNetwork: true\n  containers:\n"+container("main", "exec sleep 3600", "")))
		createPod(t, "net-host-none", podYAML("net-host-none", map[string]string{"dev.hutch.network": "none"}, "  hostNetwork: true\n  containers:\n"+container("main", "exec sleep 3600", "")))
		waitEvent(t, "net-host", "the pod asks for the host's network", 2*time.Minute)
		waitPod(t, "net-host-none", 3*time.Minute, "running", running)
		if d := ifaces("net-host-none"); strings.Contains(d, "eth0") {
			t.Fatalf("hostNetwork pod with dev.hutch.network=none sees interfaces besides lo:\n%s", d)
		}
	})

	t.Run("hutch-open", func(t *testing.T) {
		// A pod on the CNI network, made before the operator's policy
		// changes, keeps the gateway address on the node.
		createPod(t, "net-cni2", podYAML("net-cni2", nil, "  containers:\n"+container("main", "exec sleep 3600", "")))
		waitPod(t, "net-cni2", 3*time.Minute, "running", running)
		if len(podNetworkLinks()) == 0 {
			t.Fatalf("no host interface holds %s", podGateway)
		}
		setPolicy(t, `network = "open"`)
		createPod(t, "net-open", podYAML("net-open", map[string]string{"dev.hutch.network": "open"}, "  containers:\n"+container("main", "exec sleep 3600", "")))
		waitPod(t, "net-open", 3*time.Minute, "running", running)
		if d := ifaces("net-open"); !strings.Contains(d, "eth") {
			t.Fatalf("pod with dev.hutch.network=open has no interface besides lo:\n%s", d)
		}
		if out := kubectl(t, "exec", "net-open", "--", "cat", "/etc/resolv.conf"); !strings.Contains(out, "nameserver") {
			t.Fatalf("resolv.conf: %q", out)
		}
		// open denies the host itself, at any of its addresses.
		if out, err := fetch("net-open"); err == nil {
			t.Fatalf("pod with dev.hutch.network=open reached the node at %s: %q", gw, out)
		}
		if out, err := fetch("net-cni2"); err != nil || strings.TrimSpace(out) != "node-reached" {
			t.Fatalf("pod on the CNI network to the node: %q, %v", out, err)
		}
	})
}

// A pod deleted while it starts leaves nothing on the node: no runsc or
// shim processes, mounts, cgroups, network namespaces or runsc state.
func TestDeleteMidStart(t *testing.T) {
	for _, when := range []string{"at-once", "sandbox-up"} {
		t.Run(when, func(t *testing.T) {
			name := "doomed-" + when
			createPod(t, name, podYAML(name, nil, "  containers:\n"+container("main", "exec sleep 3600", "")))
			uid := ""
			var sandbox string
			if when == "sandbox-up" {
				for deadline := time.Now().Add(2 * time.Minute); sandbox == ""; time.Sleep(100 * time.Millisecond) {
					out, _ := cl.crictl("pods", "--name", name, "-q")
					sandbox = strings.TrimSpace(out)
					if time.Now().After(deadline) {
						t.Fatal("the pod's sandbox never appeared")
					}
				}
			}
			uid = strings.TrimSpace(kubectl(t, "get", "pod", name, "-o", "jsonpath={.metadata.uid}"))
			kubectl(t, "delete", "pod", name, "--grace-period=1", "--timeout=2m")
			for deadline := time.Now().Add(time.Minute); ; time.Sleep(500 * time.Millisecond) {
				out, _ := cl.crictl("pods", "--name", name, "-q")
				if strings.TrimSpace(out) == "" {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("the pod's sandbox is still on the node: %s", out)
				}
			}
			var left []string
			for i := 0; i < 50; i++ {
				if left = nodeLeftovers(uid, sandbox); len(left) == 0 {
					return
				}
				time.Sleep(200 * time.Millisecond)
			}
			t.Fatalf("pod %s left on the node:\n%s", name, strings.Join(left, "\n"))
		})
	}
}

// nodeLeftovers lists what a removed pod (its UID, and its sandbox ID if
// known) left on the node. With no other pod running, any shim or runsc
// process, network namespace or pod cgroup is a leftover.
func nodeLeftovers(uid, sandbox string) []string {
	var left []string
	for _, pid := range processesMentioning(cl.path("runsc"), nil) {
		left = append(left, "runsc process "+strconv.Itoa(pid))
	}
	// The shims containerd started from where install-node.sh put them.
	for _, pid := range processesMentioning(cl.path("node", "usr", "local", "bin", "containerd-shim-hutch-v1"), nil) {
		left = append(left, "shim process "+strconv.Itoa(pid))
	}
	for _, m := range mountsBelow(cl.dir) {
		if strings.Contains(m, "/netns/") || (sandbox != "" && strings.Contains(m, sandbox)) || strings.Contains(m, uid) {
			left = append(left, "mount "+m)
		}
	}
	for _, h := range cgroupMounts() {
		m, _ := filepath.Glob(filepath.Join(h, cl.cgroupName, "kubepods", "*pod"+uid))
		m2, _ := filepath.Glob(filepath.Join(h, cl.cgroupName, "kubepods", "*", "pod"+uid))
		for _, d := range append(m, m2...) {
			left = append(left, "cgroup "+d)
		}
	}
	if sandbox != "" {
		left = append(left, hostnet.Leftovers(context.Background(), sandbox)...)
		if m, _ := filepath.Glob(filepath.Join(cl.path("runsc"), "*", "*"+sandbox+"*")); len(m) > 0 {
			left = append(left, "runsc state "+strings.Join(m, " "))
		}
	}
	for _, l := range podNetworkLinks() {
		left = append(left, "link "+l)
	}
	return left
}
