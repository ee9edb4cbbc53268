package bench

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// ScalerRSS is the resident memory of a scaler process of its own, following the bench's
// stream: every node's report replayed, then the background reports for a while.
type ScalerRSS struct {
	Nodes int `json:"nodes"`
	GPUs  int `json:"gpus"`
	// Bytes is the process's resident set at the end, PeakBytes its highest (VmHWM).
	Bytes     int64   `json:"bytes"`
	PeakBytes int64   `json:"peak_bytes"`
	ReplayS   float64 `json:"replay_seconds"`
}

// measureScalerRSS runs `bin scaler` on the bench's bus, as a process of its own so that
// nothing else of the bench counts in its memory. It waits until the scaler says it is
// ready (the stream, one report per node, replayed), calls follow, which starts the
// nodes' reports, lets it follow them for d, and reads its resident memory from /proc.
// The reports start only once it is ready: on 2 CPUs shared with the bench's own scaler,
// a replay chasing a stream growing at 10,000 reports/s may never end.
func measureScalerRSS(ctx context.Context, bin string, bus *benchBus, cfg Config, d time.Duration, progress io.Writer, follow func()) (ScalerRSS, error) {
	res := ScalerRSS{Nodes: cfg.Nodes, GPUs: cfg.Nodes * cfg.GPUsPerNode}
	args := []string{"scaler", "--nats-url", bus.ns.ClientURL(), "--grpc-addr", "127.0.0.1:0", "--http-addr", "-",
		"--log-format", "json", "--log-level", "info", "--max-queues-per-namespace", "0"}
	if cfg.StreamMemory {
		args = append(args, "--stream-memory")
	}
	// Only what is given here configures it, not GPUSCALER_* variables of the bench's
	// environment; the password travels in the environment, out of the process list.
	env := []string{}
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "GPUSCALER_") {
			env = append(env, kv)
		}
	}
	if bus.scaler.user != "" {
		args = append(args, "--nats-user", bus.scaler.user)
		env = append(env, "GPUSCALER_NATS_PASSWORD="+bus.scaler.password)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = env
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = 10 * time.Second
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return res, err
	}
	start := time.Now()
	if err := cmd.Start(); err != nil {
		return res, fmt.Errorf("start %s scaler: %w", bin, err)
	}
	exited := make(chan error, 1)
	ready := make(chan struct{})
	var (
		mu   sync.Mutex
		tail []string // the last log lines before ready, for the error should it stop
	)
	lastLines := func() string { mu.Lock(); defer mu.Unlock(); return strings.Join(tail, "\n") }
	go func() {
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		said := false
		for sc.Scan() {
			var line struct{ Msg string }
			if json.Unmarshal(sc.Bytes(), &line) == nil && line.Msg == "ready" && !said {
				said = true
				close(ready)
			}
			if !said {
				mu.Lock()
				tail = append(tail[max(len(tail)-9, 0):], sc.Text())
				mu.Unlock()
			}
		}
		exited <- cmd.Wait()
	}()
	stop := every(progress, 5*time.Second, func() string {
		return fmt.Sprintf("      replaying: %.0f s, %d MiB resident", time.Since(start).Seconds(), procStatus(strconv.Itoa(cmd.Process.Pid), "VmRSS")>>20)
	})
	select {
	case <-ready:
		stop()
	case err := <-exited:
		stop()
		return res, fmt.Errorf("the scaler process ended before it was ready (%v): %s", err, lastLines())
	case <-time.After(2 * time.Minute):
		stop()
		return res, fmt.Errorf("the scaler process was not ready within 2 minutes: %s", lastLines())
	case <-ctx.Done():
		stop()
		return res, ctx.Err()
	}
	res.ReplayS = time.Since(start).Seconds()
	follow()
	select {
	case <-time.After(d):
	case err := <-exited:
		return res, fmt.Errorf("the scaler process ended: %v", err)
	case <-ctx.Done():
		return res, ctx.Err()
	}
	res.Bytes = procStatus(strconv.Itoa(cmd.Process.Pid), "VmRSS")
	res.PeakBytes = procStatus(strconv.Itoa(cmd.Process.Pid), "VmHWM")
	cancel()
	<-exited // a scaler stopped by SIGTERM exits cleanly; how is no concern here
	return res, nil
}

// procStatus returns a "kB" field of /proc/<pid>/status in bytes (Linux), or 0; pid
// "self" is this process.
func procStatus(pid, field string) int64 {
	f, err := os.Open("/proc/" + pid + "/status")
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), field+":"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return kb << 10
		}
	}
	return 0
}

// every writes what says to w every period until the returned stop is called: progress
// for steps that take a while.
func every(w io.Writer, period time.Duration, what func() string) (stop func()) {
	done := make(chan struct{})
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		t := time.NewTicker(period)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				fmt.Fprintln(w, what())
			}
		}
	}()
	return func() { close(done); <-finished }
}
