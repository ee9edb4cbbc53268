package embedded

import (
	"log/slog"
	"net"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/gpuscaler/gpuscaler/test/testkit"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

func start(t *testing.T, opts Options) *Server {
	t.Helper()
	s, err := Start(opts)
	if err != nil {
		t.Fatalf("Start(%+v): %v", opts, err)
	}
	t.Cleanup(s.Shutdown)
	return s
}

// createStream connects to s and creates a file-backed stream holding one message on
// subject "t.1", which makes the server write to its store.
func createStream(t *testing.T, s *Server) {
	t.Helper()
	nc, err := nats.Connect(s.ClientURL())
	if err != nil {
		t.Fatalf("connect to %s: %v", s.ClientURL(), err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateStream(t.Context(), jetstream.StreamConfig{Name: "T", Subjects: []string{"t.>"}, Storage: jetstream.FileStorage}); err != nil {
		t.Fatalf("create stream: %v", err)
	}
	if _, err := js.Publish(t.Context(), "t.1", []byte("x")); err != nil {
		t.Fatalf("publish: %v", err)
	}
}

// streamMsgs returns how many messages stream T holds, connecting to s.
func streamMsgs(t *testing.T, s *Server) uint64 {
	ctx := t.Context()
	t.Helper()
	nc, err := nats.Connect(s.ClientURL())
	if err != nil {
		t.Fatalf("connect to %s: %v", s.ClientURL(), err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	st, err := js.Stream(ctx, "T")
	if err != nil {
		t.Fatalf("stream T: %v", err)
	}
	info, err := st.Info(ctx)
	if err != nil {
		t.Fatalf("stream T info: %v", err)
	}
	return info.State.Msgs
}

func TestStartPicksAFreePort(t *testing.T) {
	tests := map[string]Options{
		"port 0":     {Addr: "127.0.0.1:0", StoreDir: t.TempDir()},
		"no address": {StoreDir: t.TempDir()},
	}
	for name, opts := range tests {
		t.Run(name, func(t *testing.T) {
			s := start(t, opts)
			url := s.ClientURL()
			if !strings.HasPrefix(url, "nats://127.0.0.1:") {
				t.Errorf("ClientURL: got %q, want nats://127.0.0.1:<port>", url)
			}
			_, port, err := net.SplitHostPort(strings.TrimPrefix(url, "nats://"))
			if err != nil {
				t.Fatalf("ClientURL %q: %v", url, err)
			}
			if n, _ := strconv.Atoi(port); n <= 0 || n == 4222 {
				t.Errorf("port: got %s, want a free port other than NATS's default 4222", port)
			}
			createStream(t, s) // JetStream is on and the server answers on that port
		})
	}
}

func TestStartExplicitPort(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	s := start(t, Options{Addr: addr, StoreDir: t.TempDir()})
	if got, want := s.ClientURL(), "nats://"+addr; got != want {
		t.Errorf("ClientURL: got %q, want %q", got, want)
	}
}

func TestStartTemporaryStoreIsRemoved(t *testing.T) {
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp) // os.MkdirTemp("", …) creates under it
	s, err := Start(Options{})
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Cleanup(s.Shutdown)
	entries, err := os.ReadDir(tmp)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 1 || !strings.HasPrefix(entries[0].Name(), "gpuscaler-nats-") {
		t.Fatalf("temporary directory holds %v, want one gpuscaler-nats-* store", entries)
	}
	if !strings.HasPrefix(s.StoreDir(), tmp) {
		t.Errorf("StoreDir: got %q, want it under %q", s.StoreDir(), tmp)
	}
	createStream(t, s)

	s.Shutdown()
	entries, err = os.ReadDir(tmp)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 0 {
		t.Errorf("after Shutdown the temporary directory holds %v, want it empty", entries)
	}
}

func TestStartStoreDirKeepsData(t *testing.T) {
	dir := t.TempDir()
	s, err := Start(Options{StoreDir: dir})
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	createStream(t, s)
	s.Shutdown()

	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) == 0 {
		t.Fatalf("StoreDir %s is empty after Shutdown, want the JetStream store kept", dir)
	}
	s = start(t, Options{StoreDir: dir})
	if got := streamMsgs(t, s); got != 1 {
		t.Errorf("messages in stream T after a restart on the same StoreDir: got %d, want 1", got)
	}
}

func TestStartRejectsBadAddr(t *testing.T) {
	tests := map[string]struct{ addr, want string }{
		"no port":        {"nonsense", `"nonsense"`},
		"port not a num": {"127.0.0.1:banana", `port "banana"`},
		"port too large": {"127.0.0.1:70000", `port "70000"`},
		"negative port":  {"127.0.0.1:-1", `port "-1"`},
		"empty port":     {"127.0.0.1:", `port ""`},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			tmp := t.TempDir()
			t.Setenv("TMPDIR", tmp)
			s, err := Start(Options{Addr: tc.addr})
			if err == nil {
				s.Shutdown()
				t.Fatalf("Start with Addr %q: got no error, want one", tc.addr)
			}
			if !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "embedded NATS address") {
				t.Errorf("got error %q, want it to name the address and %s", err, tc.want)
			}
			if entries, _ := os.ReadDir(tmp); len(entries) != 0 {
				t.Errorf("a failed Start left %v in the temporary directory, want nothing", entries)
			}
		})
	}
}

func TestStartLogsToSlog(t *testing.T) {
	var buf testkit.SyncBuffer
	log := slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	start(t, Options{StoreDir: t.TempDir(), Log: log})
	// nats-server logs its notices, such as readiness, at start; they arrive at debug level.
	out := buf.String()
	if !strings.Contains(out, "level=DEBUG") || !strings.Contains(out, "Server is ready") {
		t.Errorf("log: got %q, want the server's notices, \"Server is ready\" among them, at level DEBUG", out)
	}
}

// TestStartFailsFastWhenAddressInUse checks a taken port is reported with the server's
// reason ("address already in use"), which only the fatal-log path carries; the 10 s
// readiness timeout would say something else.
func TestStartFailsFastWhenAddressInUse(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	s, err := Start(Options{Addr: l.Addr().String(), StoreDir: t.TempDir()})
	if err == nil {
		s.Shutdown()
		t.Fatalf("Start on a taken address %s succeeded, want an error", l.Addr())
	}
	if !strings.Contains(err.Error(), "address already in use") {
		t.Fatalf("error %q does not say the address is in use", err)
	}
}
