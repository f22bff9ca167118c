package integration

import (
	"context"
	"errors"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"hutch.dev/hutch/client"
)

// Load on `hutch serve` through the real E2B SDK, on loopback: 50 SDK
// clients at once, 5 on each of 10 sandboxes of the base image, each with
// its own Sandbox.connect, run 40 commands each. Every command's output is
// unique to its client and number and is checked byte for byte (stdout,
// stderr, what the callbacks streamed, the exit code). Then every sandbox
// is killed, and nothing of them is left: no sandbox in the state root, no
// runsc process of it. Last, a tenant with a quota of 5 sandboxes creates
// 5 at once and gets each of them.
func TestServeLoad(t *testing.T) {
	requiresRoot(t)
	requireSDK(t)
	base := baseArchive(t)

	const (
		sandboxes = 10
		clients   = 5    // per sandbox
		commands  = 40   // each: 2000 in all; make bench measures throughput
		payload   = 2048 // bytes of data per command (at least), besides its tag lines
	)
	s := newServer(t, base)
	key := s.tenantAdd("load")
	const quota = 5
	quotaKey := s.tenantAdd("quota", "--max-sandboxes", strconv.Itoa(quota))
	s.serve()

	start := time.Now()
	s.runScript(t, "load.mjs", key, map[string]string{
		"LOAD_SANDBOXES": strconv.Itoa(sandboxes),
		"LOAD_CLIENTS":   strconv.Itoa(clients),
		"LOAD_COMMANDS":  strconv.Itoa(commands),
		"LOAD_PAYLOAD":   strconv.Itoa(payload),
	}, 9*time.Minute)
	t.Logf("load script: %s", time.Since(start).Round(time.Second))

	t.Run("no sandbox is left in the state root", func(t *testing.T) {
		if left := s.list(); len(left) > 0 {
			t.Fatalf("hutch ls --format json after every kill: %+v", left)
		}
	})
	t.Run("no runsc process of the state root is left", func(t *testing.T) {
		var left []string
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
			left = left[:0]
			for _, p := range processesMentioning(s.root) {
				if strings.Contains(p, "runsc") {
					left = append(left, p)
				}
			}
			if len(left) == 0 {
				break
			}
		}
		if len(left) > 0 {
			t.Fatalf("runsc processes of %s after every kill:\n%s", s.root, strings.Join(left, "\n"))
		}
	})
	t.Run("a tenant creating its whole quota of sandboxes at once gets every one, and no more", func(t *testing.T) {
		testQuotaAtOnce(t, s, quotaKey, quota)
	})
	s.stopAndCheckClean()
}

// testQuotaAtOnce creates quota sandboxes of the base image at once (a
// create that takes long enough for the others to overlap it) as the
// tenant of key, whose quota is that many: each create succeeds, one more
// is refused with 429, and they are all killed.
func testQuotaAtOnce(t *testing.T, s *server, key string, quota int) {
	c := &client.Client{APIURL: s.url(""), APIKey: key}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var (
		mu   sync.Mutex
		ids  []string
		errs []string
		wg   sync.WaitGroup
	)
	for i := 0; i < quota; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sb, err := c.Create(ctx, client.CreateRequest{TemplateID: "base", Timeout: 600})
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, err.Error())
				return
			}
			ids = append(ids, sb.ID)
		}()
	}
	wg.Wait()
	defer func() {
		for _, id := range ids {
			if err := c.Kill(ctx, id); err != nil {
				t.Errorf("kill %s: %v", id, err)
			}
		}
	}()
	sort.Strings(errs)
	if len(errs) > 0 {
		t.Fatalf("%d of %d creates at once, within the quota of %d sandboxes, failed: %v", len(errs), quota, quota, errs)
	}
	_, err := c.Create(ctx, client.CreateRequest{TemplateID: "base", Timeout: 600})
	var apiErr *client.Error
	if !errors.As(err, &apiErr) || apiErr.Status != http.StatusTooManyRequests {
		t.Fatalf("create %d over a quota of %d: %v, want a 429", quota+1, quota, err)
	}
}
