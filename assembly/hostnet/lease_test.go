package hostnet

import (
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
)

// Leases: the lowest free index, found again by ID, freed and reused;
// concurrent allocations never share an index.
func TestLeases(t *testing.T) {
	LeaseDir = filepath.Join(t.TempDir(), "net")
	defer func() { LeaseDir = "/run/hutch/net" }()
	for n := 1; n <= 5; n++ {
		i, err := allocate(fmt.Sprint("sb", n))
		if err != nil || i != n {
			t.Fatalf("allocate sb%d: %d, %v; want %d", n, i, err, n)
		}
	}
	if i, err := allocate("sb3"); err != nil || i != 3 {
		t.Fatalf("allocate sb3 again: %d, %v; want the lease it holds, 3", i, err)
	}
	if err := release("sb2"); err != nil {
		t.Fatal(err)
	}
	if i, ok := leaseOf("sb2"); ok {
		t.Fatalf("sb2 still holds %d after its release", i)
	}
	if i, err := allocate("sb6"); err != nil || i != 2 {
		t.Fatalf("allocate sb6: %d, %v; want the freed 2", i, err)
	}
	if err := release("never"); err != nil {
		t.Fatalf("release of an ID without a lease: %v", err)
	}

	// A link is trusted only if the lease it names holds its ID: sb4's
	// lease given to another behind its back is not sb4's.
	if err := os.WriteFile(leasePath(4), []byte("other"), 0o600); err != nil {
		t.Fatal(err)
	}
	if i, ok := leaseOf("sb4"); ok {
		t.Fatalf("sb4 found at %d, a lease another holds", i)
	}

	var wg sync.WaitGroup
	got := make([]int, 40)
	errs := make([]error, 40)
	for k := range got {
		wg.Add(1)
		go func() {
			defer wg.Done()
			got[k], errs[k] = allocate(fmt.Sprint("c", k))
		}()
	}
	wg.Wait()
	seen := map[int]string{1: "sb1", 2: "sb6", 3: "sb3", 4: "other", 5: "sb5"}
	for k, i := range got {
		if errs[k] != nil {
			t.Fatal(errs[k])
		}
		if prev, ok := seen[i]; ok {
			t.Fatalf("c%d got lease %d, which %s holds", k, i, prev)
		}
		seen[i] = fmt.Sprint("c", k)
		if j, ok := leaseOf(fmt.Sprint("c", k)); !ok || j != i {
			t.Fatalf("c%d: lookup %d, %v; allocated %d", k, j, ok, i)
		}
	}
}

// Leases an earlier hutch made, without links, are found (and linked) by
// the first lookup; after that a lookup reads no lease but its own.
func TestLeasesWithoutLinks(t *testing.T) {
	LeaseDir = filepath.Join(t.TempDir(), "net")
	defer func() { LeaseDir = "/run/hutch/net" }()
	if err := os.MkdirAll(LeaseDir, 0o700); err != nil {
		t.Fatal(err)
	}
	for i, id := range map[int]string{1: "old1", 2: "old2", 7: "old7"} {
		if err := os.WriteFile(leasePath(i), []byte(id), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if i, ok := leaseOf("old7"); !ok || i != 7 {
		t.Fatalf("old7: %d, %v", i, ok)
	}
	if i, err := allocate("new"); err != nil || i != 3 {
		t.Fatalf("allocate beside old leases: %d, %v; want 3", i, err)
	}
	if i, err := allocate("old2"); err != nil || i != 2 {
		t.Fatalf("allocate old2 (a resume): %d, %v; want its lease 2", i, err)
	}
	if err := release("old1"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(leasePath(1)); !os.IsNotExist(err) {
		t.Fatalf("old1's lease after its release: %v", err)
	}
	// A lease without a link that appears now is not looked for.
	if err := os.WriteFile(leasePath(9), []byte("late"), 0o600); err != nil {
		t.Fatal(err)
	}
	if i, ok := leaseOf("late"); ok {
		t.Fatalf("a lookup read every lease again (found late at %d)", i)
	}
}
