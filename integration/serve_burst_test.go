package integration

import (
	"encoding/json"
	"os"
	"strings"
	"sync"
	"testing"
	"time"
)

// A burst of creates larger than the server makes at once (--max-creates)
// queues; a create that waited --create-queue-timeout is answered 429 with
// Retry-After: 1 and E2B's error body, and holds nothing. E2B's SDK
// retries such an answer by itself, so a burst through it succeeds whole.
func TestServeCreateBurst(t *testing.T) {
	requiresRoot(t)
	requireSDK(t)
	s := newServer(t, baseArchive(t))
	key := s.tenantAdd("burst")
	s.flags = []string{"--max-creates", "1", "--create-queue-timeout", "1ms"}
	s.serve()

	t.Run("creates past the bound are answered 429 with Retry-After", func(t *testing.T) {
		const n = 6
		var wg sync.WaitGroup
		start := make(chan struct{})
		answers := make([]apiResponse, n)
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				answers[i] = s.do("POST", "/sandboxes", strings.NewReader(`{"templateID":"base"}`),
					map[string]string{"X-API-Key": key, "Content-Type": "application/json"})
			}()
		}
		close(start)
		wg.Wait()
		var created, refused int
		for _, a := range answers {
			switch a.status {
			case 201:
				created++
				var sb createdSandbox
				if err := json.Unmarshal([]byte(a.body), &sb); err != nil {
					t.Fatalf("201 body: %v: %s", err, a.body)
				}
				if r := s.do("DELETE", "/sandboxes/"+sb.SandboxID, nil, map[string]string{"X-API-Key": key}); r.status != 204 {
					t.Errorf("kill %s: %d %s", sb.SandboxID, r.status, r.body)
				}
			case 429:
				refused++
				if got := a.header.Get("Retry-After"); got != "1" {
					t.Errorf("429 with Retry-After %q, want 1", got)
				}
				code, msg, err := a.errorBody()
				if err != nil || code != 429 || !strings.Contains(msg, "try again") {
					t.Errorf("429 body: code %d message %q (%v)", code, msg, err)
				}
			default:
				t.Errorf("create: %d %s", a.status, a.body)
			}
		}
		if created == 0 || refused == 0 {
			t.Fatalf("%d concurrent creates with --max-creates 1: %d created, %d refused; want some of each", n, created, refused)
		}
		// The refused held nothing.
		if left := s.list(); len(left) != 0 {
			t.Fatalf("sandboxes after killing the created ones: %+v", left)
		}
	})

	t.Run("the SDK retries a 429 by itself", func(t *testing.T) {
		start := time.Now()
		s.runScript(t, "burst.mjs", key, map[string]string{"BURST_CREATES": "3"}, 3*time.Minute)
		t.Logf("burst of 3 SDK creates: %s", time.Since(start).Round(time.Millisecond))
		audit, err := os.ReadFile(s.audit)
		if err != nil {
			t.Fatal(err)
		}
		if n := strings.Count(string(audit), `"status":429`); n == 0 {
			t.Errorf("the server answered no create of the SDK's burst 429: the test did not test a retry")
		}
	})
	s.stopAndCheckClean()
}
