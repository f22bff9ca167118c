package serve

import (
	"context"
	"errors"
	"net/http"
	"testing"
	"time"
)

func TestCreateGate(t *testing.T) {
	g := newCreateGate(2, 30*time.Millisecond)
	var leaves []func()
	for range 2 {
		leave, err := g.enter(context.Background())
		if err != nil {
			t.Fatalf("enter under the bound: %v", err)
		}
		leaves = append(leaves, leave)
	}
	start := time.Now()
	_, err := g.enter(context.Background())
	if err == nil {
		t.Fatal("a third create entered a gate of 2")
	}
	if d := time.Since(start); d < 30*time.Millisecond {
		t.Errorf("refused after %s, before its queue timeout", d)
	}
	if got := httpStatus(err); got != http.StatusTooManyRequests {
		t.Errorf("status %d, want 429", got)
	}
	if got := retryAfter(err); got != "1" {
		t.Errorf("Retry-After %q, want 1", got)
	}
	// A create that waits gets the slot another leaves.
	go func() { time.Sleep(5 * time.Millisecond); leaves[0]() }()
	leave, err := g.enter(context.Background())
	if err != nil {
		t.Fatalf("a create waiting for a freed slot: %v", err)
	}
	// A caller that goes away stops waiting (both slots held).
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := g.enter(ctx); !errors.Is(err, context.Canceled) {
		t.Errorf("enter with a cancelled context: %v", err)
	}
	leave()
	if retryAfter(errors.New("other")) != "" {
		t.Error("Retry-After on another error")
	}
}
