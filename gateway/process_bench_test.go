package gateway

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"syscall"
	"testing"
	"time"
)

// benchGatewayEnv, when set, makes the test binary serve a gateway instead of running
// tests: its value is the routes file. startGatewayProcess starts it so.
const benchGatewayEnv = "GPUSCALER_BENCH_GATEWAY_ROUTES"

func TestMain(m *testing.M) {
	if routes := os.Getenv(benchGatewayEnv); routes != "" {
		os.Exit(serveBenchGateway(routes))
	}
	os.Exit(m.Run())
}

// serveBenchGateway serves a gateway with the routes file and no Kubernetes on a free
// loopback port, writes "listening ADDR" on standard output once its URL backends are
// ready, and serves until standard input closes (its parent ended) or a signal.
func serveBenchGateway(routes string) int {
	g, err := New(Config{RoutesFile: routes, Namespace: "ml"})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	go func() {
		_, _ = bufio.NewReader(os.Stdin).ReadString('\n') // EOF when the parent goes
		stop()
	}()
	done := make(chan error, 1)
	go func() { done <- g.Run(ctx, lis) }()
	for g.Ready() != nil || !allReady(g) {
		select {
		case err := <-done:
			fmt.Fprintln(os.Stderr, "gateway ended before it was ready:", err)
			return 1
		case <-time.After(10 * time.Millisecond):
		}
	}
	fmt.Println("listening", lis.Addr())
	if err := <-done; err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

func allReady(g *Gateway) bool {
	for _, s := range g.routing.Load().states {
		s.mu.Lock()
		ready := s.ready
		s.mu.Unlock()
		if !ready {
			return false
		}
	}
	return true
}

// startGatewayProcess runs a gateway with routes in a process of its own, as it runs
// in a cluster: the load and the backend in the benchmark's process then share no Go
// runtime (scheduler, collector) with it. It returns the gateway's address once ready.
func startGatewayProcess(b *testing.B, routes string) string {
	file := b.TempDir() + "/routes.yaml"
	if err := os.WriteFile(file, []byte(routes), 0o644); err != nil {
		b.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), benchGatewayEnv+"="+file)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		b.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		stdin.Close()
		_ = cmd.Wait()
	})
	line, err := bufio.NewReader(stdout).ReadString('\n')
	addr, ok := strings.CutPrefix(strings.TrimSpace(line), "listening ")
	if err != nil || !ok {
		b.Fatalf("the gateway process did not start: %q, %v", line, err)
	}
	return addr
}
