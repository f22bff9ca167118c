package serve

import (
	"context"
	"testing"

	"hutch.dev/hutch/credential"
	"hutch.dev/hutch/engine"
	"hutch.dev/hutch/serve/placement"
)

func TestTokenGeneration(t *testing.T) {
	s := &Server{tokens: credential.Key(make([]byte, credential.KeySize))}
	id := "0123456789abcdef0123456789abcdef"
	first, err := s.tokensOf(&engine.Sandbox{ID: id})
	if err != nil {
		t.Fatal(err)
	}
	if want := s.tokens.Token(credential.Envd, id, 0); first.Envd != want {
		t.Errorf("a sandbox without the label: envd token %s, want generation 0's %s", first.Envd, want)
	}
	second, err := s.tokensOf(&engine.Sandbox{ID: id, Labels: map[string]string{placement.LabelTokenGeneration: "1"}})
	if err != nil {
		t.Fatal(err)
	}
	if second.Envd == first.Envd || second.Traffic == first.Traffic || second.Envd == second.Traffic {
		t.Errorf("generation 1's tokens %+v: want new ones, unlike generation 0's %+v and each other", second, first)
	}
	for _, bad := range []string{"", "x", "-1", "1.5", "18446744073709551616"} {
		if _, err := s.tokensOf(&engine.Sandbox{ID: id, Labels: map[string]string{placement.LabelTokenGeneration: bad}}); err == nil {
			t.Errorf("generation %q: tokens given, want an error", bad)
		}
	}
}

func TestTokenCuts(t *testing.T) {
	var c tokenCuts
	a1, cancelA1 := context.WithCancelCause(context.Background())
	a2, cancelA2 := context.WithCancelCause(context.Background())
	b, cancelB := context.WithCancelCause(context.Background())
	defer cancelA1(nil)
	defer cancelA2(nil)
	defer cancelB(nil)
	releaseA1 := c.hold("a", cancelA1)
	releaseA2 := c.hold("a", cancelA2)
	releaseB := c.hold("b", cancelB)
	releaseA2()
	c.cut("a", errTokensReplaced)
	if a1.Err() == nil {
		t.Error("a request of a held when its tokens were cut goes on")
	}
	if a2.Err() != nil {
		t.Error("a request of a released before the cut was ended")
	}
	if b.Err() != nil {
		t.Error("a request of another sandbox was ended")
	}
	// A request of a after the cut is held anew.
	a3, cancelA3 := context.WithCancelCause(context.Background())
	defer cancelA3(nil)
	releaseA3 := c.hold("a", cancelA3)
	releaseA1() // released after the cut: leaves a's new hold alone
	if n := c.count(); n != 2 {
		t.Errorf("%d sandboxes held, want 2 (a anew, b)", n)
	}
	releaseA3()
	releaseB()
	if a3.Err() != nil {
		t.Error("a request of a held after the cut was ended")
	}
	if n := c.count(); n != 0 {
		t.Errorf("%d sandboxes held after every release, want none", n)
	}
}
