// Command hutch-init is PID 1 inside every hutch sandbox.
package main

import "hutch.dev/hutch/agent"

func main() { agent.Main() }
