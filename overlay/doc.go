// Package overlay is the hutch image store.
//
// It owns one directory tree (the store root, R):
//
//	R/oci/                 an OCI image layout (oci-layout, index.json,
//	                       blobs/<alg>/<hex>); image names are the
//	                       org.opencontainers.image.ref.name annotations in
//	                       index.json
//	R/rootfs/<chainID>/    the flattened, read-only root filesystem of every
//	                       layer chain that has been unpacked
//	R/leases/<leaseID>     the chain a sandbox is using, so that garbage
//	                       collection keeps it
//	R/lock, R/locks/       flock(2) files that serialise concurrent hutch
//	                       processes
//
// It imports and exports OCI archives, commits new layers on top of
// images, lets an image builder read and write its content directly and tag
// the result (Content, TagManifest), assembles root filesystems and
// garbage-collects what no image or lease references. Every blob is verified against its digest when it is
// written and again when it is unpacked or exported.
//
// The package stores and assembles; it never runs a sandbox and never
// execs runsc. Rootfs directories are shared by every sandbox using the same
// image and must never be written to: the sandbox runtime is expected to put
// its own writable overlay on top of them.
package overlay
