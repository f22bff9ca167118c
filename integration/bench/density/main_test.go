package main

import (
	"bytes"
	"strings"
	"testing"
	"time"
)

func TestQuantileNearestRank(t *testing.T) {
	var v []time.Duration
	for i := 100; i >= 1; i-- {
		v = append(v, time.Duration(i)*time.Millisecond)
	}
	for q, want := range map[float64]float64{0.5: 50, 0.99: 99, 1: 100} {
		if got := quantile(v, q); got != want {
			t.Errorf("quantile(1..100 ms, %v) = %v ms, want %v", q, got, want)
		}
	}
}

func TestHelperKind(t *testing.T) {
	for cmdline, want := range map[string]string{
		"/bin/hutch\x00--root\x00/s\x00lifetime-watchdog\x00ID":                                                                   "lifetime-watchdog",
		"/bin/hutch\x00__dns-resolver\x00/s/sandboxes/ID/resolver.json":                                                           "__dns-resolver",
		"/bin/hutch\x00--root\x00/s\x00--runsc\x00/r\x00port-forward\x00--inherited":                                              "port-forward",
		"/bin/hutch-helper\x00lifetime-watchdog\x00-deadline\x00T\x00--\x00/bin/hutch\x00--root\x00/s\x00lifetime-watchdog\x00ID": "lifetime-watchdog",
		"/bin/hutch-helper\x00port-forward\x00-listeners\x001\x00--\x00/bin/hutch\x00port-forward\x00--inherited":                 "port-forward",
		"/bin/hutch\x00exec\x00ID": "other",
	} {
		if got := helperKind(bytes.Split([]byte(cmdline), []byte{0})); got != want {
			t.Errorf("helperKind(%q) = %q, want %q", strings.ReplaceAll(cmdline, "\x00", " "), got, want)
		}
	}
}
