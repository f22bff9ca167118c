package engine

import (
	"context"
	"fmt"
	"maps"
	"os"
	"testing"

	"github.com/containerd/errdefs"
)

func TestSetLabels(t *testing.T) {
	e := lookupEngine(t, 2)
	ctx := context.Background()
	id := fmt.Sprintf("%04d%028x", 0, 0)
	if _, err := e.SetLabels(ctx, id, map[string]string{"a": "1", "b": "2"}); err != nil {
		t.Fatal(err)
	}
	sb, err := e.SetLabels(ctx, "sb-0", map[string]string{"a": "3", "b": ""})
	if err != nil {
		t.Fatal(err)
	}
	if want := map[string]string{"a": "3"}; !maps.Equal(sb.Labels, want) {
		t.Errorf("labels answered: %v, want %v", sb.Labels, want)
	}
	got, err := e.Get(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if want := map[string]string{"a": "3"}; !maps.Equal(got.Labels, want) {
		t.Errorf("labels recorded: %v, want %v", got.Labels, want)
	}
	if other, _ := e.Get(ctx, "sb-1"); len(other.Labels) != 0 {
		t.Errorf("another sandbox got labels %v", other.Labels)
	}
	if _, err := e.SetLabels(ctx, id, map[string]string{"": "x"}); !errdefs.IsInvalidArgument(err) {
		t.Errorf("an empty key: %v, want invalid argument", err)
	}
	if _, err := e.SetLabels(ctx, "nope", map[string]string{"a": "1"}); !errdefs.IsNotFound(err) {
		t.Errorf("an unknown sandbox: %v, want not found", err)
	}
}

func TestSetLabelsRefusesACreateUnderWay(t *testing.T) {
	e := lookupEngine(t, 0)
	sb := &record{ID: fmt.Sprintf("%032x", 7), Image: "busybox:latest", CreatorPid: os.Getpid(), Rootless: true}
	if err := os.Mkdir(e.sandboxDir(sb.ID), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := e.save(sb); err != nil {
		t.Fatal(err)
	}
	if _, err := e.SetLabels(context.Background(), sb.ID, map[string]string{"a": "1"}); !errdefs.IsFailedPrecondition(err) {
		t.Errorf("a create under way: %v, want failed precondition", err)
	}
}
