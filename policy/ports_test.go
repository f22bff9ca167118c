package policy

import (
	"errors"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
)

func TestParsePortMapping(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want PortMapping
		err  bool
	}{
		{in: "8080:80", want: PortMapping{HostIP: "127.0.0.1", HostPort: 8080, Port: 80}},
		{in: "0:80", want: PortMapping{HostIP: "127.0.0.1", HostPort: 0, Port: 80}},
		{in: "0.0.0.0:8080:80", want: PortMapping{HostIP: "0.0.0.0", HostPort: 8080, Port: 80}},
		{in: "127.0.0.2:1:65535", want: PortMapping{HostIP: "127.0.0.2", HostPort: 1, Port: 65535}},
		{in: "[::1]:8080:80", want: PortMapping{HostIP: "::1", HostPort: 8080, Port: 80}},
		{in: "80", err: true},
		{in: "", err: true},
		{in: "8080:0", err: true},
		{in: "8080:65536", err: true},
		{in: "65536:80", err: true},
		{in: "-1:80", err: true},
		{in: "a:80", err: true},
		{in: "localhost:8080:80", err: true},
		{in: "1.2.3:8080:80", err: true},
		{in: "::1:8080:80", err: true},
		{in: "[::1:8080:80", err: true},
		{in: "[1.2.3.4]:8080:80", err: true},
		{in: "[::1]:1.2.3.4:8080:80", err: true},
		{in: "1.2.3.4:8080:80:1", err: true},
		{in: " 8080:80", err: true},
		{in: "unix:/run/user/1000/web.sock:80", want: PortMapping{Socket: "/run/user/1000/web.sock", Port: 80}},
		{in: "unix:/tmp/a:b.sock:8080", want: PortMapping{Socket: "/tmp/a:b.sock", Port: 8080}},
		{in: "unix:web.sock:80", err: true},
		{in: "unix:./web.sock:80", err: true},
		{in: "unix:/tmp/../etc/web.sock:80", err: true},
		{in: "unix:/tmp/dir/:80", err: true},
		{in: "unix:/:80", err: true},
		{in: "unix::80", err: true},
		{in: "unix:/tmp/web.sock", err: true},
		{in: "unix:/tmp/web.sock:0", err: true},
		{in: "unix:/tmp/web.sock:65536", err: true},
		{in: "unix:/tmp/a\x00b:80", err: true},
		{in: "unix:/" + strings.Repeat("x", 107) + ":80", err: true},
	} {
		got, err := ParsePortMapping(tc.in)
		if tc.err {
			if !errors.Is(err, errdefs.ErrInvalidArgument) {
				t.Errorf("%q: want an invalid-argument error, got %+v, %v", tc.in, got, err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("%q: got %+v, %v; want %+v", tc.in, got, err, tc.want)
		}
	}
}

func FuzzParsePortMapping(f *testing.F) {
	for _, s := range []string{"8080:80", "[::1]:1:2", "1.2.3.4:5:6", ":", "[]:", "unix:/s:1", "unix:/a:b:2"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		m, err := ParsePortMapping(s)
		if err != nil {
			return
		}
		if m.Port == 0 || (m.HostIP == "") == (m.Socket == "") {
			t.Fatalf("%q parsed to %+v", s, m)
		}
		// What parses must survive a round trip through its own form.
		back, err := ParsePortMapping(m.Spec())
		if err != nil || back != m {
			t.Fatalf("%q -> %+v -> %q -> %+v, %v", s, m, m.Spec(), back, err)
		}
	})
}
