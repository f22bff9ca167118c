package console

import (
	"embed"
	"io/fs"
)

// dist holds the built assets (make console-assets); a plain go build
// embeds only dist/README.md, and the console then answers 503.
//
//go:embed all:dist
var dist embed.FS

// builtAssets is the embedded assets, or nil where they were not built.
func builtAssets() fs.FS {
	sub, err := fs.Sub(dist, "dist")
	if err != nil {
		return nil
	}
	if _, err := fs.Stat(sub, "index.html"); err != nil {
		return nil
	}
	return sub
}
