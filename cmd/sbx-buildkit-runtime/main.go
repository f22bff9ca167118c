// Command sbx-buildkit-runtime is the OCI runtime sbx's buildkitd runs RUN
// steps with: runc's command line, carried out by runsc.
package main

import "sbx.dev/sbx/runsc-sandbox/ociworker"

func main() { ociworker.Main() }
