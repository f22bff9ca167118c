package assembly

import "hutch.dev/hutch/assembly/hostnet"

// HelperName is the small binary beside hutch that runs a sandbox's host
// helpers (its resolver, port forwarder and lifetime watchdog; cmd/hutch-
// helper): it links only what they need, so an idle helper holds a small
// part of an idle hutch's memory (docs/decisions/0026-sandbox-helpers.md).
const HelperName = hostnet.HelperName

// Helper is HelperName beside the hutch binary hutch, or "" if there is none.
func Helper(hutch string) string { return hostnet.Helper(hutch) }
