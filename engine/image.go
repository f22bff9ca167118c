package engine

import "hutch.dev/hutch/overlay"

// Image is a tagged image as the store knows it: its name, manifest
// digest, size and where it came from.
type Image = overlay.Image
