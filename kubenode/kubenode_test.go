package kubenode

import (
	"context"
	"net"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
)

func TestValidate(t *testing.T) {
	const name = "0123456789abcdef0123456789abcdef"
	good := CheckpointRequest{Namespace: "default", Pod: "hutch-1.web", PodUID: "6f1c2a4e-8d3b-4f7a-9c1e-2b5d7e9f0a13", Name: name}
	if err := good.Validate(); err != nil {
		t.Fatalf("%+v: %v", good, err)
	}
	for _, tc := range []struct {
		what string
		edit func(*CheckpointRequest)
	}{
		{"name ../x", func(r *CheckpointRequest) { r.Name = "../x" }},
		{"name uppercase", func(r *CheckpointRequest) { r.Name = strings.ToUpper(name) }},
		{"name short", func(r *CheckpointRequest) { r.Name = name[1:] }},
		{"name long", func(r *CheckpointRequest) { r.Name = name + "0" }},
		{"name with slash", func(r *CheckpointRequest) { r.Name = name[:31] + "/" }},
		{"namespace empty", func(r *CheckpointRequest) { r.Namespace = "" }},
		{"namespace ..", func(r *CheckpointRequest) { r.Namespace = ".." }},
		{"namespace with slash", func(r *CheckpointRequest) { r.Namespace = "a/b" }},
		{"namespace with dot", func(r *CheckpointRequest) { r.Namespace = "a.b" }},
		{"namespace leading dash", func(r *CheckpointRequest) { r.Namespace = "-a" }},
		{"namespace too long", func(r *CheckpointRequest) { r.Namespace = strings.Repeat("a", 64) }},
		{"pod empty", func(r *CheckpointRequest) { r.Pod = "" }},
		{"pod ..", func(r *CheckpointRequest) { r.Pod = ".." }},
		{"pod uppercase", func(r *CheckpointRequest) { r.Pod = "Web" }},
		{"pod empty label", func(r *CheckpointRequest) { r.Pod = "a..b" }},
		{"uid empty", func(r *CheckpointRequest) { r.PodUID = "" }},
		{"uid with quote", func(r *CheckpointRequest) { r.PodUID = `a"||b` }},
	} {
		r := good
		tc.edit(&r)
		if err := r.Validate(); !errdefs.IsInvalidArgument(err) {
			t.Errorf("%s: want an invalid argument, got %v", tc.what, err)
		}
	}
	if err := (&RemoveRequest{Namespace: "default", Name: name}).Validate(); err != nil {
		t.Error(err)
	}
	if err := (&RemoveRequest{Namespace: "default", Name: "../x"}).Validate(); !errdefs.IsInvalidArgument(err) {
		t.Errorf("remove ../x: want an invalid argument, got %v", err)
	}
}

// A request the client can tell is bad never leaves it.
func TestClientRefusesBadRequestsLocally(t *testing.T) {
	c := &Client{Key: make([]byte, 32), Dial: func(context.Context, string, string) (net.Conn, error) {
		t.Fatal("the client dialled for a bad request")
		return nil, nil
	}}
	_, err := c.Checkpoint(context.Background(), "127.0.0.1", CheckpointRequest{Namespace: "default", Pod: "p", PodUID: "u", Name: "../x"})
	if !errdefs.IsInvalidArgument(err) {
		t.Fatalf("checkpoint ../x: want an invalid argument, got %v", err)
	}
	if err := c.Remove(context.Background(), "127.0.0.1", RemoveRequest{Namespace: "../etc", Name: "0123456789abcdef0123456789abcdef"}); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("remove in ../etc: want an invalid argument, got %v", err)
	}
	if _, err := c.Checkpoint(context.Background(), "node-1", CheckpointRequest{Namespace: "default", Pod: "p", PodUID: "u", Name: "0123456789abcdef0123456789abcdef"}); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("host name instead of an address: want an invalid argument, got %v", err)
	}
}
