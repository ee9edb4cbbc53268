package cluster

import (
	"context"
	"fmt"
	"path/filepath"
	"strconv"
	"time"
)

// NATS is a standalone nats-server with JetStream and HTTP monitoring: KEDA's
// nats-jetstream scaler reads /jsz from it, gpuscaler's scaler, collectors and producers
// connect to its client port.
type NATS struct {
	Server *Process
	// URL is the client URL; MonitorAddr the host:port of /jsz, /varz, /healthz.
	URL         string
	MonitorAddr string
}

// StartNATS starts nats-server with its store under dir and waits for /healthz.
func StartNATS(ctx context.Context, ps *Procs, bin, dir string) (*NATS, error) {
	port, err := FreePort()
	if err != nil {
		return nil, err
	}
	mon, err := FreePort()
	if err != nil {
		return nil, err
	}
	n := &NATS{URL: fmt.Sprintf("nats://127.0.0.1:%d", port), MonitorAddr: fmt.Sprintf("127.0.0.1:%d", mon)}
	n.Server, err = ps.Start("nats-server", bin, []string{
		"--addr=127.0.0.1", "--port=" + strconv.Itoa(port),
		"--http_port=" + strconv.Itoa(mon),
		"--jetstream", "--store_dir=" + filepath.Join(dir, "nats"),
		"--server_name=e2e",
	})
	if err != nil {
		return nil, err
	}
	err = Eventually(ctx, time.Minute, 100*time.Millisecond, "nats-server healthy", n.Server, func(ctx context.Context) (bool, error) {
		if err := httpOK(ctx, "http://"+n.MonitorAddr+"/healthz?js-enabled-only=true"); err != nil {
			return false, Retry(err)
		}
		return true, nil
	})
	if err != nil {
		return nil, err
	}
	return n, nil
}
