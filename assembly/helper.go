package assembly

import "sbx.dev/sbx/assembly/hostnet"

// HelperName is the small binary beside sbx that runs a sandbox's host
// helpers (its resolver, port forwarder and lifetime watchdog; cmd/sbx-
// helper): it links only what they need, so an idle helper holds a small
// part of an idle sbx's memory (docs/decisions/0026-sandbox-helpers.md).
const HelperName = hostnet.HelperName

// Helper is HelperName beside the sbx binary sbx, or "" if there is none.
func Helper(sbx string) string { return hostnet.Helper(sbx) }
