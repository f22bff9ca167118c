package mcp

import (
	"fmt"
	"strings"
	"sync"
)

// capture keeps the first and last bytes of a stream up to limit in all,
// and counts what it cuts between them.
type capture struct {
	mu    sync.Mutex // guards the fields below
	limit int
	head  []byte
	tail  []byte // the latest bytes after head, at most limit-len(head) once trimmed
	total int64
}

func newCapture(limit int) *capture { return &capture{limit: limit} }

func (c *capture) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := len(p)
	c.total += int64(n)
	if room := c.limit/2 - len(c.head); room > 0 {
		k := min(room, len(p))
		c.head = append(c.head, p[:k]...)
		p = p[k:]
	}
	c.tail = append(c.tail, p...)
	// Trim lazily, keeping at most twice the tail's share.
	if keep := c.limit - c.limit/2; len(c.tail) > 2*keep+4096 {
		c.tail = append(c.tail[:0], c.tail[len(c.tail)-keep:]...)
	}
	return n, nil
}

// String is what was written, with a note in place of any cut middle.
func (c *capture) String() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	s, _ := c.textLocked()
	return s
}

// Cut is how many bytes String leaves out.
func (c *capture) Cut() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	_, cut := c.textLocked()
	return cut
}

func (c *capture) textLocked() (string, int64) {
	keep := c.limit - c.limit/2
	tail := c.tail
	if len(tail) > keep {
		tail = tail[len(tail)-keep:]
	}
	cut := c.total - int64(len(c.head)) - int64(len(tail))
	if cut <= 0 {
		return strings.ToValidUTF8(string(c.head)+string(tail), "\uFFFD"), 0
	}
	note := fmt.Sprintf("\n[... %d bytes cut from the middle of %d bytes of output: redirect the output to a file in the sandbox and read the parts you need ...]\n", cut, c.total)
	return strings.ToValidUTF8(string(c.head), "\uFFFD") + note + strings.ToValidUTF8(string(tail), "\uFFFD"), cut
}
