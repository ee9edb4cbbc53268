// Package e2e runs gpuscaler against a real Kubernetes control plane and KEDA's real
// operator, started on loopback by package cluster. Run it with ./run.sh (or make e2e);
// see README.md.
package e2e

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gpuscaler/gpuscaler/test/e2e/cluster"
)

// Tests in parallel. Go runs every test that does not call t.Parallel first, one at a
// time, and only then the ones that do, all at once (run.sh sets -parallel above their
// number). So a test that measures a latency (TestWakeLatency, TestPushAtScaler,
// TestWakeAfterProducerOutage, the gateway's and the NATS cluster's figures) stays
// serial and runs alone. A test calls t.Parallel when it has its own namespace, its own
// producers and collectors, and stops or restarts nothing another test uses: the loop
// tests (their own kwok pools, behind the NATS cluster's scalers), TestAttackNodeClaim
// (its own NATS server), and the tests that mostly wait on KEDA's polls, cooldowns and
// staleAfter: TestStaleQueueNeverScalesToZero, TestStaleGPUsFallBack,
// TestFallbackReplicasZero, TestGPUUtilisationThroughKEDA and
// TestSparseTrafficStatusWrites (which counts writes within its namespace). None of the
// latter uses capacityAware, whose count on the shared scaler would see their nodes.

// env is the system every test runs against, started once by TestMain.
var env *cluster.Env

// keepDir keeps the run's folder (stores, certificates, every process's log) even when
// the tests pass.
var keepDir = flag.Bool("keep", false, "keep the run's folder (logs, stores) after a passing run")

// buildOnly builds (or finds cached) every binary and exits: run.sh builds first, so
// that the test run's timeout covers only the tests.
var buildOnly = flag.Bool("build-only", false, "build the binaries the suite runs, then exit")

func TestMain(m *testing.M) {
	flag.Parse()
	os.Exit(run(m))
}

func run(m *testing.M) int {
	start := time.Now()
	e2eRoot, err := os.Getwd()
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		return 1
	}
	repoRoot := filepath.Clean(filepath.Join(e2eRoot, "..", ".."))
	dir, err := os.MkdirTemp("", "gpuscaler-e2e-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		return 1
	}
	logDir := filepath.Join(dir, "logs")
	if err := os.MkdirAll(logDir, 0o755); err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		return 1
	}
	procs := &cluster.Procs{LogDir: logDir, Log: os.Stderr}
	defer procs.StopAll()

	// SIGINT or SIGTERM (Ctrl-C, CI cancelling) stops every child before exiting. A
	// test binary killed outright takes its children along (Pdeathsig).
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	go func() {
		sig, ok := <-sigs
		if !ok {
			return
		}
		fmt.Fprintf(os.Stderr, "e2e: %v: stopping every process; logs in %s\n", sig, logDir)
		cancel()
		procs.StopAll()
		os.Exit(2)
	}()
	defer signal.Stop(sigs)

	opts := cluster.Options{
		RepoRoot: repoRoot,
		E2ERoot:  e2eRoot,
		CacheDir: cluster.DefaultCacheDir(repoRoot),
		Dir:      dir,
		Log:      os.Stderr,
	}
	fmt.Fprintf(os.Stderr, "e2e: binaries cached in %s; this run's files in %s\n", opts.CacheDir, dir)
	bins, err := cluster.Build(ctx, opts)
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		return 1
	}
	built := time.Now()
	if *buildOnly {
		os.RemoveAll(dir)
		fmt.Fprintf(os.Stderr, "e2e: every binary is built (%s)\n", built.Sub(start).Round(time.Second))
		return 0
	}
	env, err = cluster.Start(ctx, procs, bins, opts)
	if err != nil {
		fmt.Fprintf(os.Stderr, "e2e: start: %v\n\n%s\n", err, procs.Tails(40))
		return 1
	}
	fmt.Fprintf(os.Stderr, "e2e: builds took %s, start-up %s\n", built.Sub(start).Round(time.Second), time.Since(built).Round(time.Second))

	code := m.Run()
	procs.StopAll()
	if len(loopFigures.lines) > 0 {
		fmt.Fprintf(os.Stderr, "\ne2e: the whole loop, measured:\n  %s\n\n", strings.Join(loopFigures.lines, "\n  "))
	}
	if code != 0 {
		fmt.Fprintf(os.Stderr, "\ne2e: FAILED; the last lines of every process's log follow; all logs are in %s\n\n%s\n", logDir, procs.Tails(60))
		return code
	}
	if *keepDir {
		fmt.Fprintf(os.Stderr, "e2e: logs kept in %s\n", logDir)
	} else {
		os.RemoveAll(dir)
	}
	fmt.Fprintf(os.Stderr, "e2e: passed in %s\n", time.Since(start).Round(time.Second))
	return 0
}
