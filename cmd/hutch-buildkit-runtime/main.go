// Command hutch-buildkit-runtime is the OCI runtime hutch's buildkitd runs RUN
// steps with: runc's command line, carried out by runsc.
package main

import "hutch.dev/hutch/buildimg/ociworker"

func main() { ociworker.Main() }
