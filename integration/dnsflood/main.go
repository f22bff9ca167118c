// Command dnsflood runs inside a sandbox: it sends DNS queries for random
// names under a suffix to the sandbox's nameserver as fast as it can for a
// while, without waiting for answers, and prints how many it sent and how
// many were answered. The hostile tests use it against hutch's resolver.
package main

import (
	"encoding/binary"
	"flag"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

func main() {
	suffix := flag.String("suffix", "flood.test", "the zone the names are under")
	senders := flag.Int("senders", 4, "concurrent senders")
	dur := flag.Duration("for", 10*time.Second, "how long to send")
	flag.Parse()
	ns, err := nameserver()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	var sent, answered atomic.Int64
	stop := time.Now().Add(*dur)
	var wg sync.WaitGroup
	for i := 0; i < *senders; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := net.Dial("udp4", net.JoinHostPort(ns, "53"))
			if err != nil {
				fmt.Fprintln(os.Stderr, err)
				return
			}
			defer c.Close()
			go func() {
				buf := make([]byte, 512)
				for {
					if _, err := c.Read(buf); err != nil {
						return
					}
					answered.Add(1)
				}
			}()
			for time.Now().Before(stop) {
				name := fmt.Sprintf("r%d.%s", rand.Uint64(), *suffix)
				if _, err := c.Write(query(uint16(rand.Uint32()), name)); err == nil {
					sent.Add(1)
				}
			}
			time.Sleep(time.Second) // late answers
		}()
	}
	wg.Wait()
	fmt.Printf("sent %d answered %d\n", sent.Load(), answered.Load())
}

// nameserver is the first one /etc/resolv.conf names.
func nameserver() (string, error) {
	b, err := os.ReadFile("/etc/resolv.conf")
	if err != nil {
		return "", err
	}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) == 2 && f[0] == "nameserver" {
			return f[1], nil
		}
	}
	return "", fmt.Errorf("no nameserver in /etc/resolv.conf")
}

// query is a standard recursive query for name's A record.
func query(id uint16, name string) []byte {
	b := binary.BigEndian.AppendUint16(nil, id)
	b = append(b, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0) // RD; one question
	for _, label := range strings.Split(strings.TrimSuffix(name, "."), ".") {
		b = append(b, byte(len(label)))
		b = append(b, label...)
	}
	return append(b, 0, 0, 1, 0, 1) // root, type A, class IN
}
