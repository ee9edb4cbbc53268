// Command producer is a queue producer that reports to gpuscaler: requests arrive at
// random at a mean rate, wait in a queue, and a pool of workers processes them, while a
// queue.Reporter tells the scaler how many wait and how many are in flight. A real
// service makes the same three calls where its requests arrive, start and finish.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/gpuscaler/gpuscaler/queue"
)

func main() {
	var cfg config
	flag.StringVar(&cfg.natsURL, "nats-url", "nats://127.0.0.1:4222", "NATS server URLs, comma-separated")
	flag.StringVar(&cfg.namespace, "namespace", "default", "Kubernetes namespace of the queue (the ScaledObject's)")
	flag.StringVar(&cfg.queue, "queue", "demo", "queue name, as in the trigger's queue key")
	flag.Float64Var(&cfg.rate, "rate", 5, "requests arriving per second, on average")
	flag.IntVar(&cfg.workers, "workers", 2, "requests processed at once")
	flag.DurationVar(&cfg.work, "work", 500*time.Millisecond, "average time to process one request")
	flag.StringVar(&cfg.tokenFile, "nats-token-file", "", "projected ServiceAccount token (audience gpuscaler-nats) for gpuscaler's NATS auth callout; empty connects without one")
	flag.Parse()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	if err := run(ctx, cfg, log); err != nil {
		log.Error("producer failed", "err", err)
		os.Exit(1)
	}
}

type config struct {
	natsURL, namespace, queue string
	tokenFile                 string
	rate                      float64
	workers                   int
	work                      time.Duration
}

func run(ctx context.Context, cfg config, log *slog.Logger) error {
	if cfg.rate <= 0 || cfg.workers < 1 || cfg.work <= 0 {
		return errors.New("--rate, --workers and --work must be positive")
	}
	// Keep trying to reach NATS, and keep reconnecting: the Reporter holds its reports
	// while NATS is away, and the requests go on meanwhile.
	opts := []nats.Option{nats.Name("gpuscaler-example-producer"), nats.RetryOnFailedConnect(true), nats.MaxReconnects(-1)}
	if cfg.tokenFile != "" {
		// Read the token at every connect: the kubelet rewrites the file before the token
		// expires, and the callout's user for it expires with it.
		opts = append(opts, nats.TokenHandler(func() string {
			tok, _ := os.ReadFile(cfg.tokenFile)
			return strings.TrimSpace(string(tok))
		}))
	}
	nc, err := nats.Connect(cfg.natsURL, opts...)
	if err != nil {
		return fmt.Errorf("connect to NATS: %w", err)
	}
	defer nc.Close()
	if cfg.tokenFile != "" {
		go reconnectOnNewToken(ctx, nc, cfg.tokenFile, log)
	}

	r, err := queue.NewReporter(nc, cfg.namespace, cfg.queue, queue.Config{Log: log})
	if err != nil {
		return err
	}
	log.Info("producing", "namespace", cfg.namespace, "queue", cfg.queue, "rate", cfg.rate, "workers", cfg.workers)

	requests := make(chan struct{}, 10_000)
	var wg sync.WaitGroup
	for range cfg.workers {
		wg.Go(func() {
			for {
				select {
				case <-ctx.Done():
					return
				case <-requests:
				}
				r.Started(1)
				select { // the work; abandoned on shutdown
				case <-time.After(randomDuration(cfg.work)):
				case <-ctx.Done():
				}
				r.Finished(1)
			}
		})
	}

	// Requests arrive at random (a Poisson process) until Ctrl-C.
	arrive := time.NewTimer(randomDuration(time.Duration(float64(time.Second) / cfg.rate)))
	defer arrive.Stop()
	for ctx.Err() == nil {
		select {
		case <-ctx.Done():
		case <-arrive.C:
			// Count the request before a worker can take it, so that Started never
			// comes first. This loop is the only sender, so the send cannot block.
			if len(requests) == cap(requests) {
				// Refused, but it was demand: an arrival, dropped unserved (not a
				// completion, which would shorten the service time the scaler reads).
				r.Enqueued(1)
				r.Dropped(1)
				log.Warn("queue full; request refused")
			} else {
				r.Enqueued(1)
				requests <- struct{}{}
			}
			arrive.Reset(randomDuration(time.Duration(float64(time.Second) / cfg.rate)))
		}
	}

	wg.Wait()
	log.Info("stopping; reporting the final counts")
	// The requests still queued are reported as waiting: they are, until this process
	// exits. After that the scaler sees silence, and takes no report as news.
	return r.Close()
}

// randomDuration returns an exponentially distributed duration with the given mean.
func randomDuration(mean time.Duration) time.Duration {
	return time.Duration(rand.ExpFloat64() * float64(mean))
}

// reconnectOnNewToken reconnects once the token file holds a new token, so the server
// admits the connection on it before the old token's user expires (the server would
// then close the connection itself, and a report sent meanwhile would be lost). Flush
// first: what was published so far has reached the server; what is published during the
// reconnect is buffered.
func reconnectOnNewToken(ctx context.Context, nc *nats.Conn, path string, log *slog.Logger) {
	read := func() string { tok, _ := os.ReadFile(path); return strings.TrimSpace(string(tok)) }
	last := read()
	tick := time.NewTicker(10 * time.Second)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		if tok := read(); tok != "" && tok != last && nc.IsConnected() {
			last = tok
			_ = nc.Flush()
			log.Info("token rotated; reconnecting to NATS with it")
			if err := nc.ForceReconnect(); err != nil {
				log.Warn("reconnect with the new token", "err", err)
			}
		}
	}
}
