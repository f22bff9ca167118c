package mcp

import "testing"

func TestCheckLoopback(t *testing.T) {
	for addr, ok := range map[string]bool{
		"127.0.0.1:8931": true,
		"[::1]:8931":     true,
		"localhost:0":    true,
		"0.0.0.0:8931":   false,
		":8931":          false,
		"10.0.0.1:80":    false,
		"example.com:80": false,
		"127.0.0.1":      false,
	} {
		if err := checkLoopback(addr); (err == nil) != ok {
			t.Errorf("checkLoopback(%q) = %v, want ok %v", addr, err, ok)
		}
	}
}
