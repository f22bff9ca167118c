package overlay

import (
	"bytes"
	"context"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
)

func commitCheckpoint(t *testing.T, s *Store, files map[string][]byte) Checkpoint {
	t.Helper()
	ci, err := s.NewCheckpoint(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for n, b := range files {
		if err := os.WriteFile(filepath.Join(ci.Dir(), n), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	ck, err := ci.Commit(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	return ck
}

// A checkpoint's files are cut into chunks stored once; a second
// checkpoint with a small change, some bytes inserted, stores little more;
// an evicted checkpoint is made whole again, byte for byte, and verified;
// a damaged chunk is refused; chunks no checkpoint names are collected.
func TestCheckpointChunks(t *testing.T) {
	ctx := context.Background()
	s := newStore(t)
	r := rand.New(rand.NewPCG(1, 2))
	pages := make([]byte, 8<<20)
	for i := range pages {
		pages[i] = byte(r.Uint32())
	}
	a := commitCheckpoint(t, s, map[string][]byte{"pages.img": pages, "checkpoint.img": []byte("state one")})
	ia, err := s.ChunkCheckpoint(ctx, a.Digest)
	if err != nil {
		t.Fatal(err)
	}
	if ia.New < int64(len(pages)) {
		t.Fatalf("the first checkpoint stored %d new bytes of %d", ia.New, len(pages))
	}
	// 4 KiB changed in the middle, 100 bytes inserted near the start.
	changed := append(append(append([]byte{}, pages[:1<<20]...), bytes.Repeat([]byte{7}, 100)...), pages[1<<20:]...)
	copy(changed[4<<20:], bytes.Repeat([]byte{9}, 4096))
	b := commitCheckpoint(t, s, map[string][]byte{"pages.img": changed, "checkpoint.img": []byte("state two")})
	ib, err := s.ChunkCheckpoint(ctx, b.Digest)
	if err != nil {
		t.Fatal(err)
	}
	if ib.New > int64(len(pages))/10 {
		t.Fatalf("a small change stored %d new bytes, more than a tenth of %d", ib.New, len(pages))
	}
	t.Logf("first checkpoint %d new bytes, second %d", ia.New, ib.New)

	if err := s.EvictCheckpoint(ctx, b.Digest); err != nil {
		t.Fatal(err)
	}
	if s.CheckpointWhole(b.Digest) {
		t.Fatal("evicted, its files are still there")
	}
	got, err := s.OpenCheckpoint(ctx, b.Digest)
	if err != nil {
		t.Fatal(err)
	}
	if rb, err := os.ReadFile(filepath.Join(got.Dir, "pages.img")); err != nil || !bytes.Equal(rb, changed) {
		t.Fatalf("rebuilt pages.img differs (%v)", err)
	}

	// A damaged chunk: the rebuild is refused.
	if err := s.EvictCheckpoint(ctx, b.Digest); err != nil {
		t.Fatal(err)
	}
	c := ib.Files[len(ib.Files)-1].Chunks[0]
	if err := os.WriteFile(s.chunkPath(c.Sum), bytes.Repeat([]byte{1}, int(c.Size)), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := s.OpenCheckpoint(ctx, b.Digest); err == nil {
		t.Fatal("a checkpoint rebuilt from a damaged chunk was opened")
	}

	// Collected: the chunks of a removed checkpoint that no other names.
	if err := s.RemoveCheckpoint(ctx, b.Digest); err != nil {
		t.Fatal(err)
	}
	freed, err := s.PruneChunks(ctx)
	if err != nil || freed == 0 || freed > ib.New+int64(c.Size) {
		t.Fatalf("pruned %d bytes (%v), want the second's own, about %d", freed, err, ib.New)
	}
	if _, err := s.OpenCheckpoint(ctx, a.Digest); err != nil {
		t.Fatalf("the first checkpoint after the prune: %v", err)
	}
}

func TestCut(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	b := make([]byte, 4<<20)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	n, total := 0, 0
	for len(b) > 0 {
		l := cut(b)
		if l < chunkMin && l != len(b) || l > chunkMax {
			t.Fatalf("chunk of %d bytes", l)
		}
		b = b[l:]
		n++
		total += l
	}
	if avg := total / n; avg < chunkAvg/2 || avg > chunkAvg*2 {
		t.Fatalf("average chunk %d bytes, want about %d", avg, chunkAvg)
	}
}
