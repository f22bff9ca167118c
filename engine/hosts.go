package engine

import (
	"path/filepath"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// hostsFile is a sandbox's /etc/hosts, in its state directory,
// bind-mounted read-only over the image's, as Docker and Kubernetes give
// every container one: localhost resolves in every sandbox, with or
// without network (noVNC's proxy and many dev servers dial "localhost"),
// and so does the sandbox's own hostname.
const hostsFile = "hosts"

// hostsContent is the /etc/hosts of a sandbox whose hostname is host.
func hostsContent(host string) []byte {
	return []byte("127.0.0.1\tlocalhost\n" +
		"::1\tlocalhost ip6-localhost ip6-loopback\n" +
		"127.0.1.1\t" + host + "\n")
}

// hostsMount writes sandbox id's /etc/hosts for hostname host and returns
// the mount that shows it.
func (e *Engine) hostsMount(id, host string) (specs.Mount, error) {
	path := filepath.Join(e.sandboxDir(id), hostsFile)
	if err := writeFileAtomic(path, hostsContent(host), 0o444); err != nil {
		return specs.Mount{}, err
	}
	return specs.Mount{Destination: "/etc/hosts", Type: "bind", Source: path, Options: []string{"rbind", "ro"}}, nil
}
