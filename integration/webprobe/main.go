// Command webprobe runs inside a sandbox and makes one web request the way
// an attacker would shape it: to an address or name of its choosing
// (resolved inside the sandbox), with a TLS server name and an HTTP Host
// of its choosing, each of which may disagree with the others. It prints
// the response, or "error: " and why there was none. The certificate is
// not checked: the tests look at which server answered, not whether the
// sandbox trusts it. It is static (CGO_ENABLED=0) so that it runs on any
// image.
//
//	webprobe tls|https|http ADDR:PORT SNI HOST [HEADER: VALUE]...
//	webprobe udp ADDR:PORT - PAYLOAD
//
// An empty SNI sends a ClientHello without a server name; https checks
// the server's certificate against the sandbox's trust store.
package main

import (
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"os"
	"time"
)

func main() {
	if len(os.Args) < 5 {
		fmt.Println("usage: webprobe tls|https|http ADDR:PORT SNI HOST [HEADER: VALUE]...")
		os.Exit(2)
	}
	mode, addr, sni, host := os.Args[1], os.Args[2], os.Args[3], os.Args[4]
	if mode == "udp" {
		// One datagram, as a QUIC client's first flight is: the test
		// host reports whether it arrived.
		c, err := net.Dial("udp4", addr)
		if err == nil {
			_, err = io.WriteString(c, host)
		}
		if err != nil {
			fmt.Println("error:", err)
			os.Exit(1)
		}
		fmt.Println("sent")
		return
	}
	c, err := net.DialTimeout("tcp4", addr, 5*time.Second)
	if err != nil {
		fmt.Println("error:", err)
		os.Exit(1)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	if mode == "tls" || mode == "https" {
		tc := tls.Client(c, &tls.Config{ServerName: sni, InsecureSkipVerify: mode == "tls", NextProtos: []string{"http/1.1"}})
		if err := tc.Handshake(); err != nil {
			fmt.Println("error:", err)
			os.Exit(1)
		}
		c = tc
	}
	req := fmt.Sprintf("GET / HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n", host)
	for _, h := range os.Args[5:] {
		req += h + "\r\n"
	}
	io.WriteString(c, req+"\r\n")
	b, err := io.ReadAll(c)
	fmt.Print(string(b))
	if err != nil || len(b) == 0 {
		fmt.Println("error: no response:", err)
		os.Exit(1)
	}
}
