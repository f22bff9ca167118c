package serve

import "testing"

func TestIsConsolePath(t *testing.T) {
	for p, want := range map[string]bool{
		"/console": true, "/console/": true, "/console/api/v2/sandboxes": true,
		"/consoles": false, "/console.js": false, "/v2/sandboxes": false, "/": false,
	} {
		if got := isConsolePath(p); got != want {
			t.Errorf("isConsolePath(%q) = %v, want %v", p, got, want)
		}
	}
}
