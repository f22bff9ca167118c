package engine

import (
	"hutch.dev/hutch/overlay"
	"hutch.dev/hutch/policy"
)

// What front ends parse from their users and format for them, as the
// engine reads and writes it. Errors wrap errdefs.ErrInvalidArgument.

// ParseSize parses a size such as "512m", "2GiB", "1.5g" or "1048576"
// (bytes). Units are binary: k=KiB, m=MiB, g=GiB, t=TiB, optionally
// followed by "b", "ib" (any case).
func ParseSize(s string) (int64, error) { return policy.ParseSize(s) }

// ParseRate parses a network rate in bits per second: "10mbit", "1gbit",
// "500kbit" (decimal units, as tc's).
func ParseRate(s string) (int64, error) { return policy.ParseRate(s) }

// FormatRate formats a rate as ParseRate reads it.
func FormatRate(r int64) string { return policy.FormatRate(r) }

// FormatSize formats n bytes with a binary unit ("512MiB", "1.5GiB").
func FormatSize(n int64) string { return policy.FormatSize(n) }

// ParseImageName validates an image name of the store and normalizes it:
// it always carries a tag ("base" is "base:latest"), and a registry
// reference is fully qualified, as ParseRegistryRef makes it.
func ParseImageName(s string) (string, error) { return overlay.ParseName(s) }

// ParseRegistryRef is s as a fully qualified registry reference, the way
// docker reads it: "python:3.12" is "docker.io/library/python:3.12", and a
// digest ("...@sha256:<hex>") replaces any tag.
func ParseRegistryRef(s string) (string, error) { return overlay.RegistryName(s) }

// DefaultPortIP is the host address a published port listens on when the
// user names none: the host itself only.
const DefaultPortIP = policy.DefaultPortIP

// PortSocketPrefix starts a port mapping published on a UNIX socket rather
// than a TCP port: unix:PATH:PORT.
const PortSocketPrefix = policy.SocketPrefix

// ParsePortMapping parses [IP:]HOSTPORT:PORT, or unix:PATH:PORT for a
// UNIX socket at the absolute PATH; an IPv6 IP is written in brackets
// ([::1]:8080:80).
func ParsePortMapping(s string) (PortMapping, error) { return policy.ParsePortMapping(s) }

// ParseMount parses a mount as -v writes it, SRC:PATH[:ro|:rw|:overlay],
// SRC a host path or the name of a named volume. A relative host path is
// returned as written; the caller makes it absolute or refuses it.
func ParseMount(s string) (Mount, error) {
	v, err := policy.ParseVolume(s)
	if err != nil {
		return Mount{}, err
	}
	return Mount{Source: v.Source, Volume: v.Volume, Target: v.Target, ReadOnly: v.ReadOnly, Overlay: v.Overlay}, nil
}

// CheckVolumeName validates the name of a named volume: letters, digits,
// '_', '.' and '-', starting with a letter or digit, at most 63 characters.
func CheckVolumeName(name string) error { return policy.CheckVolumeName(name) }
