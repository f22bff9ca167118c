package wire

import (
	"bytes"
	"encoding/binary"
	"reflect"
	"testing"
)

func TestSSHConfigFrame(t *testing.T) {
	want := SSHConfig{HostKey: []byte("-----BEGIN OPENSSH PRIVATE KEY-----\n"), AuthorizedKeys: []string{"ssh-ed25519 AAAA a@b"}}
	var b bytes.Buffer
	if err := WriteSSHConfig(&b, want); err != nil {
		t.Fatal(err)
	}
	b.WriteString("SSH-2.0-client\r\n")
	got, err := ReadSSHConfig(&b)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("read %+v, wrote %+v", got, want)
	}
	// The connection's bytes follow the frame untouched.
	if rest := b.String(); rest != "SSH-2.0-client\r\n" {
		t.Fatalf("after the frame: %q", rest)
	}
}

func TestSSHConfigFrameRefused(t *testing.T) {
	for name, in := range map[string][]byte{
		"empty":     nil,
		"truncated": {0, 0, 0, 10, '{'},
		"too large": binary.BigEndian.AppendUint32(nil, maxSSHConfig+1),
		"not json":  append(binary.BigEndian.AppendUint32(nil, 3), "abc"...),
	} {
		if _, err := ReadSSHConfig(bytes.NewReader(in)); err == nil {
			t.Errorf("%s: read without error", name)
		}
	}
}
