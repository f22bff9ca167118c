package overlay

// Persistence: what the store keeps of a sandbox, and what it promises.
//
// Vocabulary
//
//	layer       One OCI layer tar, compressed (gzip, or zstd for a
//	            snapshot) or, for a snapshot whose changes do not
//	            compress, not; stored as a blob named by the digest of its
//	            stored bytes; its diff_id is the digest of the
//	            uncompressed tar. A layer is immutable: the same bytes
//	            always have the same name, and a layer whose bytes no
//	            longer match its name is never applied (ErrCorrupt).
//
//	image       An ordered list of layers plus a runtime config, written as
//	            an OCI manifest and config and tagged with a name in
//	            index.json. Its rootfs (Rootfs) is the layers applied in
//	            order, whiteouts resolved. Tagging is the last step of every
//	            write: an image is visible complete or not at all.
//
//	upper       The writable layer gVisor keeps above a sandbox's read-only
//	            rootfs, as `runsc tar rootfs-upper` exports it: a tar of the
//	            sandbox's tmpfs upper filesystem in which a deleted path is a
//	            0/0 character device and a directory that hides everything
//	            below it carries the xattr trusted.overlay.opaque=y.
//
//	snapshot    An image made from a sandbox: the image the sandbox runs
//	            plus one layer converted from its upper (Snapshot). Deleted
//	            paths become OCI whiteouts (.wh.NAME), opaque directories get
//	            a .wh..wh..opq entry, and modes, owners, times, xattrs,
//	            symlinks and hard links are kept. A snapshot of a sandbox
//	            running a snapshot adds one more layer: snapshots chain.
//
//	checkpoint  A sandbox's memory and filesystem state as runsc checkpoint
//	            writes it (a directory of image files), stored under the
//	            digest of a manifest listing every file with its size and
//	            checksums (XXH64 per 16 MiB chunk), or, committed unsealed,
//	            its size and the host's boot, the checksums following in
//	            sums.json once sealed. The store holds checkpoints; it
//	            never runs or restores one: the engine points runsc at
//	            Checkpoint.Dir.
//
// Guarantees
//
//   - Content addressing. Layers and checkpoints are named by the digest
//     of what they hold and verified against it before use: a layer while it
//     is unpacked (Rootfs), a checkpoint by OpenCheckpoint, which checks
//     every file against the checksums its manifest (or sums.json)
//     records, and refuses one that was never sealed before the host
//     restarted. A flipped or missing byte yields an error wrapping
//     ErrCorrupt and nothing is unpacked or handed out. Layers are verified with SHA-256 as they may
//     come from anywhere; checkpoints, which never leave the host that
//     wrote them, with XXH64, which catches damage at memory speed.
//     A layer's digests are computed while it streams into the store,
//     never by reading it back.
//
//   - Atomicity. A snapshot is written as blobs and then tagged; a
//     checkpoint is written into a hidden ingest directory and renamed to its
//     digest only once hashed. A process killed at any point leaves no
//     visible image or checkpoint, only hidden leftovers that Prune removes.
//
//   - Determinism. The layer of a snapshot depends only on the upper's
//     content: entries are in name order (each directory's entries in byte
//     order of their names, right after it), headers are written in PAX
//     format without access or change times or user and group names, and
//     compression is deterministic (zstd at a fixed level, whose output
//     depends on neither its concurrency nor the write sizes; whether a
//     layer is compressed depends on its first 4 MiB). Two
//     sandboxes with identical changes (same paths, contents, modes,
//     owners, xattrs and modification times) give the same layer digest;
//     snapshotting an unchanged sandbox twice gives the same image digest.
//     Modification times are kept, not normalised: they are part of the
//     change (make and friends rely on them).
//
//   - Exclusions. A snapshot never contains the paths named in
//     SnapshotOptions.Exclude (the engine excludes /run, where secrets
//     live, and /.hutch, where its agent lives), nor sockets.
//
//   - Ownership. The store does not know which sandbox uses a checkpoint:
//     whoever commits one removes it (RemoveCheckpoint). Prune removes
//     images' unreferenced blobs and interrupted ingests, never a committed
//     checkpoint.
