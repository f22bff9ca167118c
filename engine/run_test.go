package engine

import "testing"

// runsc's errors as the pinned runsc prints them for a command it cannot
// start (integration/run_test.go runs the same cases through runsc).
func TestNotStarted(t *testing.T) {
	const prefix = "running container: starting container: starting root container: starting sandbox: "
	for _, tc := range []struct {
		stderr, cmd string
		code        int
		msg         string
		ok          bool
	}{
		{prefix + `error finding executable "nosuch" in PATH [/usr/bin /bin]: no such file or directory` + "\n",
			"nosuch", ExitNotFound, "nosuch: command not found", true},
		{prefix + `error finding executable "data" in PATH [/usr/bin /bin]: permission denied` + "\n",
			"data", ExitNotExecutable, "data: permission denied", true},
		{prefix + "creating process: failed to load /no/such: no such file or directory\n",
			"/no/such", ExitNotFound, "/no/such: no such file or directory", true},
		{"W1129 19:00:00.000000 1 log.go:1] a warning first\n" + prefix + "creating process: failed to load /etc: permission denied\n",
			"/etc", ExitNotExecutable, "/etc: permission denied", true},
		{prefix + "creating process: failed to load /bin/x: exec format error",
			"/bin/x", ExitNotExecutable, "/bin/x: exec format error", true},
		{"running container: creating container: cannot create sandbox: cgroup: permission denied\n", "sh", 0, "", false},
		{"", "sh", 0, "", false},
	} {
		code, msg, ok := notStarted(tc.stderr, tc.cmd)
		if code != tc.code || msg != tc.msg || ok != tc.ok {
			t.Errorf("notStarted(%q) = %d, %q, %v; want %d, %q, %v", tc.stderr, code, msg, ok, tc.code, tc.msg, tc.ok)
		}
	}
}
