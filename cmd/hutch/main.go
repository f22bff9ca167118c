// Command hutch runs commands in disposable gVisor sandboxes.
package main

import (
	"os"

	"hutch.dev/hutch/cmd/hutch/commands"
	"hutch.dev/hutch/cmd/hutch/commands/clix"
	"hutch.dev/hutch/engine"
)

func main() {
	// A pool's refill, started by a claim, begins once the claimer's
	// command has had the CPU, or as this process ends.
	engine.DeferPoolFills()
	code := commands.Main(os.Args)
	engine.StartPoolFills()
	clix.EndIfBrokenPipe()
	os.Exit(code)
}
