package engine

import (
	"strings"
	"testing"
	"time"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"hutch.dev/hutch/overlay"
)

func TestParseReadyCheck(t *testing.T) {
	for in, want := range map[string]ReadyCheck{
		"port:8000":                       {Kind: "port", Arg: "8000"},
		"url:http://127.0.0.1:8888/api":   {Kind: "url", Arg: "http://127.0.0.1:8888/api"},
		"url:http://localhost:80/":        {Kind: "url", Arg: "http://localhost:80/"},
		"file:/tmp/ready":                 {Kind: "file", Arg: "/tmp/ready"},
		"time:1500ms":                     {Kind: "time", Wait: 1500 * time.Millisecond},
		"cmd:test -e /tmp/x":              {Kind: "cmd", Arg: "test -e /tmp/x"},
		"curl -sf http://127.0.0.1:8000/": {Kind: "cmd", Arg: "curl -sf http://127.0.0.1:8000/"},
		"pgrep -f jupyter":                {Kind: "cmd", Arg: "pgrep -f jupyter"},
		"sh -c 'echo a:b'":                {Kind: "cmd", Arg: "sh -c 'echo a:b'"},
	} {
		got, err := ParseReadyCheck(in)
		if err != nil || got != want {
			t.Errorf("ParseReadyCheck(%q) = %+v, %v; want %+v", in, got, err, want)
		}
	}
	for in, why := range map[string]string{
		"":                            "empty",
		"port:0":                      "port number",
		"port:http":                   "port number",
		"url:https://127.0.0.1:1/":    "http:// URL",
		"url:http://127.0.0.1/":       "with a port",
		"url:http://example.test:80/": "the sandbox's own",
		"file:relative":               "absolute path",
		"time:soon":                   "positive duration",
		"time:-1s":                    "positive duration",
		"cmd:":                        "empty command",
	} {
		if _, err := ParseReadyCheck(in); err == nil || !strings.Contains(err.Error(), why) {
			t.Errorf("ParseReadyCheck(%q): %v, want an error saying %q", in, err, why)
		}
	}
}

func TestTemplateOf(t *testing.T) {
	img := func(labels map[string]string) overlay.Image {
		return overlay.Image{Name: "t:latest", Config: ocispec.Image{Config: ocispec.ImageConfig{Labels: labels}}}
	}
	if tmpl, err := TemplateOf(img(nil)); tmpl != nil || err != nil {
		t.Errorf("an image without labels: %v, %v; want no template", tmpl, err)
	}
	tmpl, err := TemplateOf(img(map[string]string{LabelStart: "server"}))
	if err != nil || tmpl.Start != "server" || tmpl.Ready.Kind != "time" || tmpl.Ready.Wait != time.Second || tmpl.Timeout != DefaultReadyTimeout {
		t.Errorf("start only: %+v, %v; want the start command ready after a second", tmpl, err)
	}
	tmpl, err = TemplateOf(img(map[string]string{LabelStart: "server", LabelReady: "port:80", LabelReadyTimeout: "30s"}))
	if err != nil || tmpl.Ready != (ReadyCheck{Kind: "port", Arg: "80"}) || tmpl.Timeout != 30*time.Second {
		t.Errorf("all three: %+v, %v", tmpl, err)
	}
	for labels, why := range map[*map[string]string]string{
		{LabelReady: "port:80"}:                         "without " + LabelStart,
		{LabelStart: "s", LabelReady: "port:x"}:         LabelReady,
		{LabelStart: "s", LabelReadyTimeout: "a while"}: LabelReadyTimeout,
	} {
		if _, err := TemplateOf(img(*labels)); err == nil || !strings.Contains(err.Error(), why) {
			t.Errorf("labels %v: %v, want an error naming %q", *labels, err, why)
		}
	}
}
