// Command sbx-init is PID 1 inside every sbx sandbox.
package main

import "sbx.dev/sbx/runsc-sandbox/agent"

func main() { agent.Main() }
