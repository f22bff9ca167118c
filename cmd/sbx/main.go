// Command sbx runs commands in disposable gVisor sandboxes.
package main

import (
	"os"

	"sbx.dev/sbx/cmd/sbx/commands"
)

func main() { os.Exit(commands.Main(os.Args)) }
