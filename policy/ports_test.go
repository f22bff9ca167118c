package policy

import (
	"errors"
	"testing"

	"github.com/containerd/errdefs"
)

func TestParsePortMapping(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want PortMapping
		err  bool
	}{
		{in: "8080:80", want: PortMapping{"127.0.0.1", 8080, 80}},
		{in: "0:80", want: PortMapping{"127.0.0.1", 0, 80}},
		{in: "0.0.0.0:8080:80", want: PortMapping{"0.0.0.0", 8080, 80}},
		{in: "127.0.0.2:1:65535", want: PortMapping{"127.0.0.2", 1, 65535}},
		{in: "[::1]:8080:80", want: PortMapping{"::1", 8080, 80}},
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
	for _, s := range []string{"8080:80", "[::1]:1:2", "1.2.3.4:5:6", ":", "[]:"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		m, err := ParsePortMapping(s)
		if err != nil {
			return
		}
		if m.Port == 0 || m.HostIP == "" {
			t.Fatalf("%q parsed to %+v", s, m)
		}
		// What parses must survive a round trip through its own form.
		back, err := ParsePortMapping(formatMapping(m))
		if err != nil || back != m {
			t.Fatalf("%q -> %+v -> %q -> %+v, %v", s, m, formatMapping(m), back, err)
		}
	})
}

func formatMapping(m PortMapping) string {
	return m.HostAddr() + ":" + itoa(m.Port)
}

func itoa(p uint16) string {
	b := []byte{}
	for {
		b = append([]byte{byte('0' + p%10)}, b...)
		p /= 10
		if p == 0 {
			return string(b)
		}
	}
}
