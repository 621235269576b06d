package kube

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
)

// Ports for the bed's servers are picked, released, then bound by the
// server a moment later. Asking the kernel for one (port 0) hands out a
// port of the ephemeral range, which it hands out again at once to any
// other process's port-0 listener or outgoing connection: with the test
// packages running side by side, a server then found its port taken (CI
// saw a webhook replica fail so). Ports are picked below the ephemeral
// range instead, where only a fixed-port listener (checked) or another
// pick (not within this process) can take them.

var picked = struct {
	sync.Mutex
	ports map[int]bool
}{ports: map[int]bool{}}

// FreeAddr returns a loopback address ("127.0.0.1:port") nobody listens
// on, below the kernel's ephemeral port range, not returned before by this
// process.
func FreeAddr() (string, error) {
	port, err := freePort()
	if err != nil {
		return "", err
	}
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), nil
}

// freePort is FreeAddr's port.
func freePort() (int, error) {
	hi := ephemeralStart()
	lo := max(hi-12000, 1024)
	picked.Lock()
	defer picked.Unlock()
	for range 200 {
		port := lo + rand.IntN(hi-lo)
		if picked.ports[port] {
			continue
		}
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		if err != nil {
			continue
		}
		l.Close()
		picked.ports[port] = true
		return port, nil
	}
	return 0, fmt.Errorf("no free loopback port in %d-%d", lo, hi-1)
}

// ephemeralStart is the first port of the kernel's ephemeral range.
func ephemeralStart() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			if n, err := strconv.Atoi(f[0]); err == nil && n > 2048 {
				return n
			}
		}
	}
	return 32768 // Linux's default
}
