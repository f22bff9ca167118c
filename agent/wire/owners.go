package wire

// A rootless sandbox's image is unpacked on the host as one user's files,
// root's inside the sandbox; the image store keeps the owners the image
// gives its files in a list instead, which the engine mounts read-only at
// OwnersPath. CmdApplyOwners sets them once, as root inside the sandbox
// and before anything else runs there: the chown changes gVisor's rootfs
// overlay (a copy-up of the file's metadata), never the host's file.
//
// The list has one line per entry, "UID GID MODE PATH": decimal IDs, the
// octal permission bits (a chown clears setuid and setgid, so they are set
// again) and the absolute path quoted as Go quotes strings.
const (
	OwnersPath = "/.hutch/owners"
	// CmdApplyOwners is "apply-owners [--user UID:GID] [-- CMD [ARG...]]":
	// it sets the owners OwnersPath lists, then runs CMD as UID:GID, if
	// given, in its place.
	CmdApplyOwners = "apply-owners"
)
