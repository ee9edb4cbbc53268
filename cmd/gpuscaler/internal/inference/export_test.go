package inference

import (
	"context"
	"time"
)

// Played is what one policy did to one service, for the tests outside the package that
// check the model's invariants on replay's scenarios.
type Played struct {
	Starts                []time.Duration // when each request's service started; -1: never
	Waits                 []float64       // seconds, by request
	Restarted, Cold       int
	GPUSeconds, Lifetimes float64
}

// Play runs svc under p until end, paying for GPU time as a replay whose last request
// arrives at last does.
func Play(ctx context.Context, cfg Config, p Policy, svc Service, end, last time.Duration) (Played, error) {
	run, err := newSim(cfg, p, svc, end, cfg.paidTo(last), newTimeline(end)).play(ctx)
	return Played{Starts: run.starts, Waits: run.waits, Restarted: run.restarted, Cold: run.cold,
		GPUSeconds: run.gpuSeconds, Lifetimes: run.lifetimes}, err
}
