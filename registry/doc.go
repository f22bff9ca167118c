// Package registry moves images between hutch's image store (overlay) and OCI
// registries: pull, push, and the credentials both use.
//
// The registry protocol is containerd's (core/remotes/docker): references
// are resolved, blobs fetched and pushed, and every blob verified against
// its digest by containerd's content writer as it lands in the store.
// Credentials come from hutch's own file under the state root (Login) and
// then from docker's config (~/.docker/config.json or $DOCKER_CONFIG, with
// its credential helpers), read through docker's own config package.
//
// A pull writes blobs into the store's content area and names the image
// only once every blob of this platform's manifest is there: an error at any
// point leaves no image named and no half-written blob behind (blobs that
// did complete are left for the store's garbage collection).
//
// The package talks to registries and the store; it runs no sandbox and
// prints nothing: progress goes to a BuildKit status channel.
package registry
