package cluster

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"sync"
)

// ScalerSet is gpuscaler's scaler as the chart deploys it: replicas behind a headless
// Service, every replica reading the whole GPUSCALER stream, here on a NATS cluster with
// the stream at replicas 3. Replica i listens on 127.0.0.(i+1), all on one port, and the
// Service's name resolves to the ready ones (DNS).
type ScalerSet struct {
	// Name is the headless Service's DNS name; Port the gRPC port.
	Name string
	Port int
	DNS  *DNS

	g        *Gpuscaler
	replicas []*scalerReplica
}

type scalerReplica struct {
	ip    net.IP
	name  string
	flags []string

	mu sync.Mutex
	s  *Scaler
}

// StartScalerSet starts n scaler replicas on the NATS cluster, publishes their addresses
// under name on dns and waits until each is ready.
func StartScalerSet(ctx context.Context, g *Gpuscaler, dns *DNS, name string, n int, extra ...string) (*ScalerSet, error) {
	port, err := freePortOnLoopbacks(n)
	if err != nil {
		return nil, err
	}
	set := &ScalerSet{Name: name, Port: port, DNS: dns, g: g}
	for i := range n {
		ip := net.IPv4(127, 0, 0, byte(i+1))
		httpAddr, err := FreeAddr()
		if err != nil {
			return nil, err
		}
		r := &scalerReplica{ip: ip, name: fmt.Sprintf("gpuscaler-%d", i), flags: append([]string{
			"--nats-url=" + g.NATSURL,
			"--stream-replicas=3",
			"--grpc-addr=" + net.JoinHostPort(ip.String(), strconv.Itoa(port)),
			"--http-addr=" + httpAddr,
		}, extra...)}
		set.replicas = append(set.replicas, r)
	}
	for i := range set.replicas {
		if err := set.Start(ctx, i); err != nil {
			return nil, err
		}
	}
	return set, nil
}

// Address is the trigger's scalerAddress: gRPC's DNS resolver asks dns for the Service's
// name, as KEDA's client does in a cluster with the Service's name.
func (set *ScalerSet) Address() string {
	return fmt.Sprintf("dns://%s/%s:%d", set.DNS.Addr, set.Name, set.Port)
}

// Replica is the running scaler i (nil while stopped).
func (set *ScalerSet) Replica(i int) *Scaler {
	r := set.replicas[i]
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.s
}

// Len is the number of replicas.
func (set *ScalerSet) Len() int { return len(set.replicas) }

// Stop stops replica i and takes its address out of the Service's DNS, as the
// endpoints controller does when a pod goes.
func (set *ScalerSet) Stop(i int) {
	r := set.replicas[i]
	r.mu.Lock()
	s := r.s
	r.s = nil
	r.mu.Unlock()
	set.publish()
	if s != nil {
		s.Stop()
	}
}

// Start starts replica i (again), waits for its /readyz (its replay of the stream is
// done) and puts its address back in the Service's DNS.
func (set *ScalerSet) Start(ctx context.Context, i int) error {
	r := set.replicas[i]
	s, err := set.g.startScalerAt(ctx, r.name, r.flags, net.JoinHostPort(r.ip.String(), strconv.Itoa(set.Port)))
	if err != nil {
		return err
	}
	r.mu.Lock()
	r.s = s
	r.mu.Unlock()
	set.publish()
	return nil
}

// publish makes the Service's name resolve to the running replicas.
func (set *ScalerSet) publish() {
	var ips []net.IP
	for _, r := range set.replicas {
		r.mu.Lock()
		if r.s != nil {
			ips = append(ips, r.ip)
		}
		r.mu.Unlock()
	}
	set.DNS.Set(set.Name, ips...)
}

// freePortOnLoopbacks finds a TCP port free on 127.0.0.1 to 127.0.0.n (Linux routes all
// of 127.0.0.0/8 to the loopback interface).
func freePortOnLoopbacks(n int) (int, error) {
	for range 50 {
		port, err := FreePort()
		if err != nil {
			return 0, err
		}
		free := true
		var held []net.Listener
		for i := range n {
			l, err := net.Listen("tcp", net.JoinHostPort(net.IPv4(127, 0, 0, byte(i+1)).String(), strconv.Itoa(port)))
			if err != nil {
				free = false
				break
			}
			held = append(held, l)
		}
		for _, l := range held {
			l.Close()
		}
		if free {
			return port, nil
		}
	}
	return 0, fmt.Errorf("no port free on 127.0.0.1 to 127.0.0.%d", n)
}
