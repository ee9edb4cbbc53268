package cluster

import (
	"errors"
	"net"
	"strings"
	"sync"

	"golang.org/x/net/dns/dnsmessage"
)

// DNS is a DNS server on loopback (UDP) that answers A queries for the names it is given,
// as cluster DNS answers for a headless Service: one A record per ready pod. Everything
// else of those names (AAAA, TXT) has no records; other names do not exist.
//
// KEDA reaches it through gRPC's own DNS resolver: a scalerAddress of
// dns://<this server>/<name>:<port> resolves name here, and KEDA's round_robin policy
// spreads its calls over every address, as over a headless Service's pods.
type DNS struct {
	Addr string

	conn *net.UDPConn
	mu   sync.Mutex
	a    map[string][]net.IP // by lower-case name with the final dot
	done chan struct{}
}

// StartDNS serves on a free loopback port until Close.
func StartDNS() (*DNS, error) {
	conn, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		return nil, err
	}
	d := &DNS{Addr: conn.LocalAddr().String(), conn: conn, a: map[string][]net.IP{}, done: make(chan struct{})}
	go d.serve()
	return d, nil
}

// Set makes name resolve to ips (none: the name has no addresses).
func (d *DNS) Set(name string, ips ...net.IP) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.a[canonical(name)] = ips
}

// Close stops the server.
func (d *DNS) Close() error {
	err := d.conn.Close()
	<-d.done
	return err
}

func canonical(name string) string {
	return strings.ToLower(strings.TrimSuffix(name, ".")) + "."
}

func (d *DNS) serve() {
	defer close(d.done)
	buf := make([]byte, 1500)
	for {
		n, from, err := d.conn.ReadFromUDP(buf)
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		if resp, ok := d.answer(buf[:n]); ok {
			_, _ = d.conn.WriteToUDP(resp, from)
		}
	}
}

// answer builds the response to one query, or says to drop it.
func (d *DNS) answer(query []byte) ([]byte, bool) {
	var p dnsmessage.Parser
	h, err := p.Start(query)
	if err != nil {
		return nil, false
	}
	q, err := p.Question()
	if err != nil {
		return nil, false
	}
	d.mu.Lock()
	ips, known := d.a[canonical(q.Name.String())]
	d.mu.Unlock()
	rh := dnsmessage.Header{ID: h.ID, Response: true, Authoritative: true, RecursionDesired: h.RecursionDesired}
	if !known {
		rh.RCode = dnsmessage.RCodeNameError
	}
	b := dnsmessage.NewBuilder(nil, rh)
	b.EnableCompression()
	if b.StartQuestions() != nil || b.Question(q) != nil || b.StartAnswers() != nil {
		return nil, false
	}
	if known && q.Type == dnsmessage.TypeA {
		for _, ip := range ips {
			var a [4]byte
			copy(a[:], ip.To4())
			if b.AResource(dnsmessage.ResourceHeader{Name: q.Name, Class: dnsmessage.ClassINET, TTL: 1}, dnsmessage.AResource{A: a}) != nil {
				return nil, false
			}
		}
	}
	resp, err := b.Finish()
	return resp, err == nil
}
