package main

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/gpuscaler/gpuscaler/test/testkit"
)

// TestAttackStatusPageByDefault: the status page lists every namespace's triggers,
// queues and pods to whoever reaches --http-addr, the port every scraper and probe
// reaches. A scaler started with its defaults must not serve it; --status-page must.
func TestAttackStatusPageByDefault(t *testing.T) {
	for _, c := range []struct {
		name  string
		flags []string
		want  int
	}{
		{"defaults", nil, http.StatusNotFound},
		{"--status-page", []string{"--status-page"}, http.StatusOK},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(t.Context())
			var stdout, stderr testkit.SyncBuffer
			done := make(chan int, 1)
			args := append([]string{"scaler", "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0",
				"--embedded-nats-addr", "127.0.0.1:0", "--data-dir", t.TempDir()}, c.flags...)
			go func() { done <- run(ctx, args, mapEnv(nil), &stdout, &stderr) }()
			t.Cleanup(func() {
				cancel()
				select {
				case <-done:
				case <-time.After(10 * time.Second):
					t.Errorf("scaler still running 10s after its context ended")
				}
			})
			testkit.Eventually(t, 15*time.Second, func() bool { // ready, and serving: logged in either order
				log := stderr.String()
				return strings.Contains(log, " msg=ready ") && strings.Contains(log, "serving metrics and probes")
			})
			httpAddr, ok := logValue(stderr.String(), "serving metrics and probes", "httpAddr")
			if !ok {
				t.Fatalf("no httpAddr in log:\n%s", stderr.String())
			}
			resp, err := http.Get("http://" + httpAddr + "/status")
			if err != nil {
				t.Fatal(err)
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != c.want {
				t.Errorf("GET /status with %v: got %d, want %d", c.flags, resp.StatusCode, c.want)
			}
		})
	}
}
