package buildimg

import (
	"reflect"
	"strings"
	"testing"
)

func TestImageRefs(t *testing.T) {
	for _, tc := range []struct {
		name string
		src  string
		args map[string]string
		want []imageRef
		err  string
	}{
		{"plain", "FROM busybox\nRUN true\n", nil, []imageRef{{"busybox:latest", 1}}, ""},
		{"scratch is no image", "FROM scratch\nCOPY a /\n", nil, nil, ""},
		{"stages are no images", "FROM base:v1 AS b\nFROM b\nCOPY --from=b /x /\nCOPY --from=0 /y /\n", nil,
			[]imageRef{{"base:v1", 1}}, ""},
		{"copy from an image", "FROM scratch\nCOPY --from=tools /t /\n", nil, []imageRef{{"tools:latest", 2}}, ""},
		{"meta args expand", "ARG IMG=busybox\nFROM $IMG\n", nil, []imageRef{{"busybox:latest", 2}}, ""},
		{"build args override", "ARG IMG=busybox\nFROM ${IMG}:v2\n", map[string]string{"IMG": "base"}, []imageRef{{"base:v2", 2}}, ""},
		{"syntax error names the line", "FROM busybox\nRUNX true\n", nil, nil, "line 2"},
		{"bad name", "FROM Bad/Name\n", nil, nil, "lowercase"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := imageRefs([]byte(tc.src), tc.args)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("want an error with %q, got %v", tc.err, err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestFamiliar(t *testing.T) {
	for _, tc := range []struct{ name, want string }{
		{"base:latest", "base"},
		{"app:v1", "app:v1"},
		{"my-org/x:latest", "my-org/x"},
		{"docker.io/library/python:3.12", "python:3.12"},
		{"docker.io/o/r:latest", "o/r"},
		{"127.0.0.1:5000/test/busybox:1", "127.0.0.1:5000/test/busybox:1"},
		{"ghcr.io/o/r:latest", "ghcr.io/o/r"},
	} {
		if got := familiar(tc.name); got != tc.want {
			t.Errorf("familiar(%q) = %q, want %q", tc.name, got, tc.want)
		}
	}
}
