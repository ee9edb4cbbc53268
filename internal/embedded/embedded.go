// Package embedded runs a NATS server with JetStream inside the gpuscaler process: the
// scaler's default when given no NATS URL, the demo's message bus, and the tests' real
// server.
package embedded

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strconv"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// Options configures the embedded server. The zero value listens on a random loopback port
// and stores JetStream data in a temporary directory removed at shutdown.
type Options struct {
	// Addr is host:port to listen on for other processes' clients. Port 0 picks a free one.
	// Empty means 127.0.0.1 with a free port.
	Addr string
	// StoreDir holds JetStream data. Empty means a temporary directory, removed at shutdown.
	StoreDir string
	// Log receives the server's warnings and errors (its notices at debug level).
	Log *slog.Logger
	// Config, when set, is nats-server configuration text (accounts, authorization)
	// applied before the address and store above, which win.
	Config string
}

// Server is a running embedded NATS server.
type Server struct {
	*server.Server
	tmpDir string
}

// Start starts the server and waits until it accepts connections.
func Start(opts Options) (*Server, error) {
	host, port := "127.0.0.1", -1
	if opts.Addr != "" {
		h, p, err := net.SplitHostPort(opts.Addr)
		if err != nil {
			return nil, fmt.Errorf("embedded NATS address %q: %w", opts.Addr, err)
		}
		n, err := strconv.Atoi(p)
		if err != nil || n < 0 || n > 65535 {
			return nil, fmt.Errorf("embedded NATS address %q: port %q is not a number from 0 to 65535", opts.Addr, p)
		}
		host = h
		if n != 0 { // nats-server reads 0 as its default port and -1 as "pick one"
			port = n
		}
	}
	s := &Server{}
	storeDir := opts.StoreDir
	if storeDir == "" {
		dir, err := os.MkdirTemp("", "gpuscaler-nats-")
		if err != nil {
			return nil, fmt.Errorf("embedded NATS store: %w", err)
		}
		storeDir, s.tmpDir = dir, dir
	}
	sopts := &server.Options{}
	if opts.Config != "" {
		var err error
		if sopts, err = configOptions(opts.Config); err != nil {
			s.removeTmp()
			return nil, err
		}
	}
	sopts.ServerName, sopts.Host, sopts.Port = "gpuscaler-embedded", host, port
	sopts.JetStream, sopts.StoreDir, sopts.NoSigs = true, storeDir, true
	ns, err := server.NewServer(sopts)
	if err != nil {
		s.removeTmp()
		return nil, fmt.Errorf("embedded NATS: %w", err)
	}
	log := opts.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	fatal := make(chan string, 1)
	ns.SetLoggerV2(logAdapter{log: log, fatal: fatal}, false, false, false)
	s.Server = ns
	ns.Start()
	for deadline := time.Now().Add(10 * time.Second); !ns.ReadyForConnections(25 * time.Millisecond); {
		select {
		case msg := <-fatal: // nats-server reports a failed listen here, then waits forever
			ns.Shutdown()
			s.removeTmp()
			return nil, fmt.Errorf("embedded NATS: %s", msg)
		default:
		}
		if time.Now().After(deadline) {
			ns.Shutdown()
			s.removeTmp()
			return nil, errors.New("embedded NATS did not become ready within 10s")
		}
	}
	return s, nil
}

// Shutdown stops the server, waits for it, and removes a temporary store.
func (s *Server) Shutdown() {
	s.Server.Shutdown()
	s.WaitForShutdown()
	s.removeTmp()
}

func (s *Server) removeTmp() {
	if s.tmpDir != "" {
		_ = os.RemoveAll(s.tmpDir)
	}
}

// logAdapter routes nats-server's log lines to slog. A fatal line, which would end a
// standalone server, is also handed to Start.
type logAdapter struct {
	log   *slog.Logger
	fatal chan<- string
}

func (l logAdapter) Noticef(format string, v ...any) { l.log.Debug(fmt.Sprintf(format, v...)) }
func (l logAdapter) Warnf(format string, v ...any)   { l.log.Warn(fmt.Sprintf(format, v...)) }
func (l logAdapter) Fatalf(format string, v ...any) {
	msg := fmt.Sprintf(format, v...)
	l.log.Error(msg)
	select {
	case l.fatal <- msg:
	default:
	}
}
func (l logAdapter) Errorf(format string, v ...any) { l.log.Error(fmt.Sprintf(format, v...)) }
func (l logAdapter) Debugf(format string, v ...any) { l.log.Debug(fmt.Sprintf(format, v...)) }
func (l logAdapter) Tracef(format string, v ...any) { l.log.Debug(fmt.Sprintf(format, v...)) }

// configOptions parses nats-server configuration text.
func configOptions(text string) (*server.Options, error) {
	f, err := os.CreateTemp("", "gpuscaler-nats-*.conf")
	if err != nil {
		return nil, fmt.Errorf("embedded NATS configuration: %w", err)
	}
	defer os.Remove(f.Name())
	if _, err := f.WriteString(text); err != nil {
		f.Close()
		return nil, fmt.Errorf("embedded NATS configuration: %w", err)
	}
	if err := f.Close(); err != nil {
		return nil, fmt.Errorf("embedded NATS configuration: %w", err)
	}
	o, err := server.ProcessConfigFile(f.Name())
	if err != nil {
		return nil, fmt.Errorf("embedded NATS configuration: %w", err)
	}
	return o, nil
}
