package engine

import (
	"context"

	"hutch.dev/hutch/assembly"
)

// RunResolver is the body of ResolverCommand: it serves the DNS resolver
// configured by the file cfg until ctx ends, telling the engine that
// started it once it listens.
func RunResolver(ctx context.Context, cfg string) error {
	return assembly.ServeResolverProcess(ctx, cfg)
}
