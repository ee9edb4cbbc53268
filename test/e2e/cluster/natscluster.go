package cluster

import (
	"context"
	"fmt"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"
)

// NATSCluster is a JetStream cluster of three nats-servers, routed on loopback, as the
// chart's NATS cluster mode runs it. Each server can be stopped and started again with
// its store, which is how the suite takes one away.
type NATSCluster struct {
	Servers []*NATSNode
	// URLs lists every server's client URL, comma-separated, for --nats-url.
	URLs string

	ps  *Procs
	bin string
}

// NATSNode is one server of a NATSCluster.
type NATSNode struct {
	Name        string
	URL         string
	MonitorAddr string

	mu   sync.Mutex
	proc *Process
	args []string
}

// StartNATSCluster starts three servers, routed to each other, with their stores under
// dir, and waits until JetStream is ready on each (a meta leader elected).
func StartNATSCluster(ctx context.Context, ps *Procs, bin, dir string) (*NATSCluster, error) {
	c := &NATSCluster{ps: ps, bin: bin}
	const n = 3
	routes := make([]string, n)
	clusterPorts := make([]int, n)
	for i := range n {
		p, err := FreePort()
		if err != nil {
			return nil, err
		}
		clusterPorts[i] = p
		routes[i] = fmt.Sprintf("nats://127.0.0.1:%d", p)
	}
	var urls []string
	for i := range n {
		port, err := FreePort()
		if err != nil {
			return nil, err
		}
		mon, err := FreePort()
		if err != nil {
			return nil, err
		}
		s := &NATSNode{
			Name:        fmt.Sprintf("nats-%d", i),
			URL:         fmt.Sprintf("nats://127.0.0.1:%d", port),
			MonitorAddr: fmt.Sprintf("127.0.0.1:%d", mon),
		}
		s.args = []string{
			"--addr=127.0.0.1", "--port=" + strconv.Itoa(port),
			"--http_port=" + strconv.Itoa(mon),
			"--jetstream", "--store_dir=" + filepath.Join(dir, s.Name),
			"--server_name=" + s.Name,
			"--cluster_name=gpuscaler-e2e",
			"--cluster=nats://127.0.0.1:" + strconv.Itoa(clusterPorts[i]),
			"--routes=" + strings.Join(routes, ","),
		}
		c.Servers = append(c.Servers, s)
		urls = append(urls, s.URL)
	}
	c.URLs = strings.Join(urls, ",")
	for _, s := range c.Servers {
		if err := c.start(s); err != nil {
			return nil, err
		}
	}
	for _, s := range c.Servers {
		if err := c.WaitReady(ctx, s); err != nil {
			return nil, err
		}
	}
	return c, nil
}

func (c *NATSCluster) start(s *NATSNode) error {
	p, err := c.ps.Start(s.Name, c.bin, s.args)
	if err != nil {
		return err
	}
	s.mu.Lock()
	s.proc = p
	s.mu.Unlock()
	return nil
}

// Kill kills server s at once (SIGKILL): no leadership handed over, no goodbye to its
// routes; its store stays on disk.
func (c *NATSCluster) Kill(s *NATSNode) {
	s.mu.Lock()
	p := s.proc
	s.mu.Unlock()
	p.Kill()
}

// Restart starts s again on its store and waits until it is ready.
func (c *NATSCluster) Restart(ctx context.Context, s *NATSNode) error {
	if err := c.start(s); err != nil {
		return err
	}
	return c.WaitReady(ctx, s)
}

// Process is s's current process.
func (s *NATSNode) Process() *Process {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.proc
}

// WaitReady waits until s answers /healthz with JetStream enabled: it has joined the
// cluster and a meta leader is known.
func (c *NATSCluster) WaitReady(ctx context.Context, s *NATSNode) error {
	return Eventually(ctx, 2*time.Minute, 100*time.Millisecond, s.Name+" healthy in the cluster", s.Process(), func(ctx context.Context) (bool, error) {
		if err := httpOK(ctx, "http://"+s.MonitorAddr+"/healthz?js-enabled-only=true"); err != nil {
			return false, Retry(err)
		}
		var jsz struct {
			MetaCluster struct {
				Leader string `json:"leader"`
			} `json:"meta_cluster"`
		}
		if err := getJSON(ctx, http.DefaultClient, "http://"+s.MonitorAddr+"/jsz", &jsz); err != nil {
			return false, Retry(err)
		}
		if jsz.MetaCluster.Leader == "" {
			return false, Retry(fmt.Errorf("no JetStream meta leader yet"))
		}
		return true, nil
	})
}

// StreamInfo is what a server's /jsz says of a stream: its leader, its replicas and
// how many subjects and messages it holds.
type StreamInfo struct {
	Leader   string
	Replicas []string
	Subjects int
	Messages uint64
}

// Stream asks server s for stream's state (/jsz?streams=true).
func (c *NATSCluster) Stream(ctx context.Context, s *NATSNode, stream string) (StreamInfo, error) {
	var jsz struct {
		AccountDetails []struct {
			StreamDetail []struct {
				Name    string `json:"name"`
				Cluster struct {
					Leader   string `json:"leader"`
					Replicas []struct {
						Name string `json:"name"`
					} `json:"replicas"`
				} `json:"cluster"`
				State struct {
					Messages    uint64 `json:"messages"`
					NumSubjects int    `json:"num_subjects"`
				} `json:"state"`
			} `json:"stream_detail"`
		} `json:"account_details"`
	}
	if err := getJSON(ctx, http.DefaultClient, "http://"+s.MonitorAddr+"/jsz?streams=true&accounts=true", &jsz); err != nil {
		return StreamInfo{}, err
	}
	for _, a := range jsz.AccountDetails {
		for _, sd := range a.StreamDetail {
			if sd.Name != stream {
				continue
			}
			info := StreamInfo{Leader: sd.Cluster.Leader, Subjects: sd.State.NumSubjects, Messages: sd.State.Messages}
			for _, r := range sd.Cluster.Replicas {
				info.Replicas = append(info.Replicas, r.Name)
			}
			return info, nil
		}
	}
	return StreamInfo{}, fmt.Errorf("%s: no stream %s in /jsz", s.Name, stream)
}

// Node returns the server named name.
func (c *NATSCluster) Node(name string) (*NATSNode, error) {
	for _, s := range c.Servers {
		if s.Name == name {
			return s, nil
		}
	}
	return nil, fmt.Errorf("no NATS server %s", name)
}
