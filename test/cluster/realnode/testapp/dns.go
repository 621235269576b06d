package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/miekg/dns"
)

// dnsServer answers A queries for one name with the pod's own IPv4 address
// (POD_IP), so every answer says which backend answered, over UDP and TCP;
// other names get NXDOMAIN. /ready on -ready answers 200 once both
// listeners are up (CoreDNS's ready plugin does the same); -delay answers
// every query that much later (a slow upstream). On SIGTERM it
// stops at once: a DNS Deployment's grace before that is its preStop (or
// CoreDNS's lameduck, which is the same wait inside the process).
func dnsServer(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("dns-server", flag.ContinueOnError)
	port := fs.Int("port", 53, "DNS port (UDP and TCP)")
	name := fs.String("name", "", "the name answered (fully qualified)")
	readyAddr := fs.String("ready", ":8181", "listen address of /ready")
	delay := fs.Duration("delay", 0, "answer every query this much later")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *name == "" {
		return errors.New("-name is required")
	}
	qname := dns.Fqdn(*name)
	ip, err := netip.ParseAddr(os.Getenv("POD_IP"))
	if err != nil || !ip.Is4() {
		return fmt.Errorf("reading POD_IP %q: want an IPv4 address (%v)", os.Getenv("POD_IP"), err)
	}
	handler := dns.HandlerFunc(func(w dns.ResponseWriter, r *dns.Msg) {
		m := new(dns.Msg)
		m.SetReply(r)
		m.Authoritative = true
		switch {
		case len(r.Question) != 1:
			m.SetRcode(r, dns.RcodeFormatError)
		case !strings.EqualFold(r.Question[0].Name, qname):
			m.SetRcode(r, dns.RcodeNameError)
		case r.Question[0].Qtype == dns.TypeA:
			m.Answer = []dns.RR{&dns.A{
				Hdr: dns.RR_Header{Name: r.Question[0].Name, Rrtype: dns.TypeA, Class: dns.ClassINET},
				A:   ip.AsSlice(),
			}}
		}
		if *delay > 0 {
			time.Sleep(*delay)
		}
		w.WriteMsg(m)
	})
	addr := net.JoinHostPort("", strconv.Itoa(*port))
	var mu sync.Mutex
	started := 0
	servers := []*dns.Server{
		{Addr: addr, Net: "udp", Handler: handler},
		{Addr: addr, Net: "tcp", Handler: handler},
	}
	errc := make(chan error, len(servers))
	for _, s := range servers {
		s.NotifyStartedFunc = func() { mu.Lock(); started++; mu.Unlock() }
		go func() { errc <- s.ListenAndServe() }()
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/ready", func(w http.ResponseWriter, _ *http.Request) {
		mu.Lock()
		n := started
		mu.Unlock()
		if n < len(servers) {
			http.Error(w, "starting", http.StatusServiceUnavailable)
			return
		}
		io.WriteString(w, "ok\n")
	})
	go http.ListenAndServe(*readyAddr, mux)
	fmt.Printf("%s answering %s A %s on :%d (udp, tcp)\n", time.Now().UTC().Format(time.RFC3339Nano), qname, ip, *port)
	select {
	case err := <-errc:
		return fmt.Errorf("serving DNS: %w", err)
	case <-ctx.Done():
	}
	fmt.Printf("%s SIGTERM: stopping\n", time.Now().UTC().Format(time.RFC3339Nano))
	sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	for _, s := range servers {
		s.ShutdownContext(sctx)
	}
	fmt.Printf("%s stopped\n", time.Now().UTC().Format(time.RFC3339Nano))
	return nil
}

// Lookup is one DNS lookup of a client, as /lookups serves it.
type Lookup struct {
	At      int64  `json:"at"`           // when it was sent, Unix nanoseconds
	Took    int64  `json:"took"`         // nanoseconds until the answer or the failure
	Backend string `json:"be,omitempty"` // the address in the answer: the pod that answered
	Fail    string `json:"fail,omitempty"`
}

// lookupLog records every lookup of a client in the order they started.
type lookupLog struct {
	mu      sync.Mutex
	lookups []Lookup
	errors  []string // the first failures, with their time and text
}

// start reserves the record of a lookup beginning now.
func (l *lookupLog) start(at time.Time) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lookups = append(l.lookups, Lookup{At: at.UnixNano()})
	return len(l.lookups) - 1
}

func (l *lookupLog) done(i int, backend string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	lk := &l.lookups[i]
	lk.Took, lk.Backend = time.Now().UnixNano()-lk.At, backend
}

func (l *lookupLog) failed(i int, class string, err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	lk := &l.lookups[i]
	lk.Took, lk.Fail = time.Now().UnixNano()-lk.At, class
	if len(l.errors) < 50 {
		l.errors = append(l.errors, time.Now().UTC().Format(time.RFC3339Nano)+" "+class+": "+err.Error())
	}
}

// serve serves /stats (totals, the first failures) and /lookups?from=N
// (every lookup from the Nth on; the last ones may still be pending,
// with neither a backend nor a failure).
func (l *lookupLog) serve(addr, target string) {
	mux := http.NewServeMux()
	mux.HandleFunc("/stats", func(w http.ResponseWriter, _ *http.Request) {
		l.mu.Lock()
		st := Stats{Target: target, Fails: map[string]int{}, By: map[string]int{}, Errors: append([]string(nil), l.errors...)}
		for _, lk := range l.lookups {
			switch {
			case lk.Fail != "":
				st.Fails[lk.Fail]++
			case lk.Backend != "":
				st.OK++
				st.By[lk.Backend]++
			}
		}
		l.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(st)
	})
	mux.HandleFunc("/lookups", func(w http.ResponseWriter, r *http.Request) {
		from, _ := strconv.Atoi(r.URL.Query().Get("from"))
		l.mu.Lock()
		out := append([]Lookup(nil), l.lookups[min(max(from, 0), len(l.lookups)):]...)
		l.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(out)
	})
	go http.ListenAndServe(addr, mux)
}

// dnsClient looks up -name every -interval, each lookup with -timeout,
// concurrently as stub resolvers do, and records each one:
//
//   - -mode go: Go's own resolver (PreferGo) dialing -server, a connected
//     UDP socket per query;
//   - -mode sendto: one long-lived unconnected UDP socket, queries sent
//     with sendto() and answers read with recvfrom(), matched by ID, as
//     glibc's and musl's stub resolvers do. An answer from any address but
//     -server is a failure (wrong-source): glibc and musl drop it and the
//     lookup times out.
func dnsClient(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("dns-client", flag.ContinueOnError)
	mode := fs.String("mode", "go", "go | sendto")
	server := fs.String("server", "", "the DNS server, ip:port (the Service's ClusterIP)")
	name := fs.String("name", "", "the name to look up")
	interval := fs.Duration("interval", 20*time.Millisecond, "time between lookups")
	timeout := fs.Duration("timeout", time.Second, "per-lookup timeout")
	statsAddr := fs.String("stats", ":9000", "listen address of /stats and /lookups")
	if err := fs.Parse(args); err != nil {
		return err
	}
	srv, err := netip.ParseAddrPort(*server)
	if err != nil || !srv.Addr().Is4() {
		return fmt.Errorf("reading -server %q: want IPv4 ip:port (%v)", *server, err)
	}
	if *name == "" {
		return errors.New("-name is required")
	}
	log := &lookupLog{}
	log.serve(*statsAddr, *server)
	switch *mode {
	case "go":
		return goResolverClient(ctx, log, srv, dns.Fqdn(*name), *interval, *timeout)
	case "sendto":
		return sendtoClient(ctx, log, srv, dns.Fqdn(*name), *interval, *timeout)
	}
	return fmt.Errorf("unknown -mode %q", *mode)
}

func goResolverClient(ctx context.Context, log *lookupLog, srv netip.AddrPort, name string, interval, timeout time.Duration) error {
	r := &net.Resolver{
		PreferGo: true,
		Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, network, srv.String())
		},
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			i := log.start(time.Now())
			lctx, cancel := context.WithTimeout(ctx, timeout)
			defer cancel()
			ips, err := r.LookupNetIP(lctx, "ip4", name)
			switch {
			case err != nil:
				if ctx.Err() == nil {
					log.failed(i, classifyDNS(err), err)
				}
			case len(ips) == 0:
				log.failed(i, "no-answer", errors.New("no address in the answer"))
			default:
				log.done(i, ips[0].Unmap().String())
			}
		}()
	}
}

// classifyDNS names a resolver error's kind for the tables.
func classifyDNS(err error) string {
	var de *net.DNSError
	switch {
	// Go's resolver keeps only the text of a read error.
	case errors.Is(err, syscall.ECONNREFUSED), errors.As(err, &de) && strings.Contains(de.Err, "connection refused"):
		return "refused"
	case errors.As(err, &de) && de.IsTimeout, errors.Is(err, context.DeadlineExceeded):
		return "timeout"
	case errors.As(err, &de) && de.IsNotFound:
		return "nxdomain"
	}
	return classify(err)
}

// pendingQuery is a sendto client's query awaiting its answer.
type pendingQuery struct {
	index int
	sent  time.Time
}

func sendtoClient(ctx context.Context, log *lookupLog, srv netip.AddrPort, name string, interval, timeout time.Duration) error {
	// One unconnected socket for the client's life: every query goes out
	// with sendto() to srv.
	conn, err := net.ListenUDP("udp4", nil)
	if err != nil {
		return fmt.Errorf("opening the UDP socket: %w", err)
	}
	defer conn.Close()
	go func() { <-ctx.Done(); conn.Close() }()
	var mu sync.Mutex
	pending := map[uint16]pendingQuery{}
	take := func(id uint16) (pendingQuery, bool) {
		mu.Lock()
		defer mu.Unlock()
		q, ok := pending[id]
		delete(pending, id)
		return q, ok
	}
	go func() {
		buf := make([]byte, 4096)
		for {
			n, from, err := conn.ReadFromUDPAddrPort(buf)
			if err != nil {
				if ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
					return
				}
				continue // an ICMP error surfaced on the socket: the lookup times out
			}
			m := new(dns.Msg)
			if err := m.Unpack(buf[:n]); err != nil {
				continue
			}
			q, ok := take(m.Id)
			if !ok {
				continue // late: already counted as a timeout
			}
			from = netip.AddrPortFrom(from.Addr().Unmap(), from.Port())
			switch {
			case time.Since(q.sent) > timeout:
				log.failed(q.index, "timeout", fmt.Errorf("answer %d after %v", m.Id, time.Since(q.sent)))
			case from != srv:
				log.failed(q.index, "wrong-source", fmt.Errorf("answer %d from %s, sent to %s", m.Id, from, srv))
			case m.Rcode != dns.RcodeSuccess:
				log.failed(q.index, "rcode-"+dns.RcodeToString[m.Rcode], fmt.Errorf("answer %d: %s", m.Id, dns.RcodeToString[m.Rcode]))
			default:
				be := ""
				for _, rr := range m.Answer {
					if a, ok := rr.(*dns.A); ok {
						be = a.A.String()
						break
					}
				}
				if be == "" {
					log.failed(q.index, "no-answer", fmt.Errorf("answer %d has no A record", m.Id))
				} else {
					log.done(q.index, be)
				}
			}
		}
	}()
	tick := time.NewTicker(interval)
	defer tick.Stop()
	dst := net.UDPAddrFromAddrPort(srv)
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
		now := time.Now()
		// Expire what waited too long.
		var expired []pendingQuery
		mu.Lock()
		for id, q := range pending {
			if now.Sub(q.sent) >= timeout {
				expired = append(expired, q)
				delete(pending, id)
			}
		}
		var id uint16
		for {
			id = uint16(rand.Uint32())
			if _, busy := pending[id]; !busy {
				break
			}
		}
		i := log.start(now)
		pending[id] = pendingQuery{index: i, sent: now}
		mu.Unlock()
		for _, q := range expired {
			log.failed(q.index, "timeout", fmt.Errorf("no answer within %v", timeout))
		}
		m := new(dns.Msg)
		m.SetQuestion(name, dns.TypeA)
		m.Id = id
		b, err := m.Pack()
		if err != nil {
			return fmt.Errorf("packing a query: %w", err)
		}
		if _, err := conn.WriteToUDP(b, dst); err != nil {
			if _, ok := take(id); ok {
				log.failed(i, "send-"+classify(err), err)
			}
		}
	}
}
