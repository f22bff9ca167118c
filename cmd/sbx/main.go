// Command sbx runs commands in disposable gVisor sandboxes.
package main

import (
	"os"

	"sbx.dev/sbx/cmd/sbx/commands"
	"sbx.dev/sbx/cmd/sbx/commands/clix"
	"sbx.dev/sbx/engine"
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
