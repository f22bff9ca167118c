package mcp

import "testing"

func TestRemoteClient(t *testing.T) {
	c, err := remoteClient("http://127.0.0.1:3000/", "e2b_k")
	if err != nil || c.APIURL != "http://127.0.0.1:3000" || c.APIKey != "e2b_k" {
		t.Errorf("remoteClient: %+v, %v", c, err)
	}
	for _, bad := range []string{"127.0.0.1:3000", "ftp://h", "http://", "http://h?x=1", "http://u:p@h", ":"} {
		if _, err := remoteClient(bad, "k"); err == nil {
			t.Errorf("remoteClient(%q) accepted", bad)
		}
	}
}
