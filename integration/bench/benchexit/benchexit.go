// Package benchexit ends a benchmark program that has failed without
// leaving its sandboxes behind: log.Fatal would skip its deferred
// clean-up.
package benchexit

import (
	"fmt"
	"log"
	"os"
	"sync"
)

var (
	mu       sync.Mutex
	cleanups []func()
)

// AtExit registers f to run, last registered first, before Fatal exits.
func AtExit(f func()) {
	mu.Lock()
	defer mu.Unlock()
	cleanups = append(cleanups, f)
}

// Fatal logs v, runs the clean-ups and exits with status 1.
func Fatal(v ...any) { exit(fmt.Sprint(v...)) }

// Fatalf is Fatal with a format.
func Fatalf(format string, v ...any) { exit(fmt.Sprintf(format, v...)) }

func exit(msg string) {
	log.Print(msg)
	mu.Lock()
	fs := cleanups
	cleanups = nil
	mu.Unlock()
	for i := len(fs) - 1; i >= 0; i-- {
		fs[i]()
	}
	os.Exit(1)
}
