package wire

import "testing"

func TestStarted(t *testing.T) {
	for _, c := range []struct {
		log  string
		want bool
	}{
		{"", false},
		{"2026-01-01T00:00:00.000000Z init started\n", true},
		{"runsc: some warning\n2026-01-01T00:00:00.000000Z init started\n", true},
		{"2026-01-01T00:00:00.000000Z init cannot take spawn requests: address in use\n", true},
		// A process's own output, or a spawn, is not the init starting.
		{"2026-01-01T00:00:00.000000Z 12 init started\n", false},
		{"2026-01-01T00:00:00.000000Z init started 12 (supervised): sleep\n", false},
		{"2026-01-01T00:00:00.000000Z init started /bin/sh: sleep 1\n", false},
	} {
		if got := Started([]byte(c.log)); got != c.want {
			t.Errorf("Started(%q) = %v, want %v", c.log, got, c.want)
		}
	}
}
