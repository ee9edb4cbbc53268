package cluster

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Process is a child process in its own process group, its output in a log file. Stop
// ends the whole group; the kernel kills it too if the test binary dies first.
type Process struct {
	Name    string
	LogPath string
	cmd     *exec.Cmd
	done    chan struct{} // closed when the process has exited
	err     error         // the exit status, set before done is closed
	once    sync.Once
}

// Procs keeps every process started, so that one call stops them all, whatever happened.
// It is safe for concurrent use.
type Procs struct {
	// LogDir holds one <name>.log per process.
	LogDir string
	// Log receives progress lines.
	Log io.Writer

	mu    sync.Mutex // guards procs and names
	procs []*Process
	names map[string]int
}

// Start runs bin with args and env (added to the test's own environment).
func (ps *Procs) Start(name, bin string, args []string, env ...string) (*Process, error) {
	ps.mu.Lock()
	if ps.names == nil {
		ps.names = map[string]int{}
	}
	ps.names[name]++
	file := name
	if n := ps.names[name]; n > 1 {
		file = fmt.Sprintf("%s.%d", name, n)
	}
	ps.mu.Unlock()

	logPath := filepath.Join(ps.LogDir, file+".log")
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(f, "# %s %s\n", bin, strings.Join(args, " "))
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		f.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &Process{Name: file, LogPath: logPath, cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		f.Close()
		close(p.done)
	}()
	ps.mu.Lock()
	ps.procs = append(ps.procs, p)
	ps.mu.Unlock()
	fmt.Fprintf(ps.Log, "e2e: started %s (pid %d), log %s\n", file, cmd.Process.Pid, logPath)
	return p, nil
}

// StopAll stops every process still running, the last started first.
func (ps *Procs) StopAll() {
	ps.mu.Lock()
	procs := append([]*Process(nil), ps.procs...)
	ps.mu.Unlock()
	for i := len(procs) - 1; i >= 0; i-- {
		procs[i].Stop()
	}
}

// Stop ends the process group with SIGTERM, then SIGKILL after 10 s, and waits for the
// process. Calling it again does nothing.
func (p *Process) Stop() {
	p.once.Do(func() {
		pgid := p.cmd.Process.Pid
		_ = syscall.Kill(-pgid, syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(10 * time.Second):
			_ = syscall.Kill(-pgid, syscall.SIGKILL)
			<-p.done
		}
		// A group member that outlived the leader goes too.
		_ = syscall.Kill(-pgid, syscall.SIGKILL)
	})
}

// Kill ends the process group at once with SIGKILL, as a machine that loses power or an
// OOM kill would, and waits for the process. Stop after it does nothing.
func (p *Process) Kill() {
	p.once.Do(func() {
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		<-p.done
	})
}

// Exited reports whether the process has ended, and how.
func (p *Process) Exited() (bool, error) {
	select {
	case <-p.done:
		return true, p.err
	default:
		return false, nil
	}
}

// Tail returns the last n lines of the process's log.
func (p *Process) Tail(n int) string {
	return tailFile(p.LogPath, n)
}

func tailFile(path string, n int) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	lines := bytes.Split(bytes.TrimRight(data, "\n"), []byte("\n"))
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return string(bytes.Join(lines, []byte("\n")))
}

// Tails returns the last n lines of every process's log, each under its name.
func (ps *Procs) Tails(n int) string {
	ps.mu.Lock()
	procs := append([]*Process(nil), ps.procs...)
	ps.mu.Unlock()
	var b strings.Builder
	for _, p := range procs {
		fmt.Fprintf(&b, "----- %s (last %d lines of %s)\n%s\n", p.Name, n, p.LogPath, p.Tail(n))
	}
	return b.String()
}

// FreePort returns a loopback TCP port nothing listens on now, and never the same one
// twice in a run: the suite's processes bind their ports after it has closed its probe,
// and one port handed to two of them (two NATS servers' cluster ports once) failed a run
// before any test. Ports come from below the kernel's ephemeral range
// (ip_local_port_range), which outgoing connections take theirs from, so only a process
// that binds a fixed port there can take one before the caller does; where that range
// cannot be read, or leaves too little below it, from the ephemeral range itself.
func FreePort() (int, error) {
	portsMu.Lock()
	defer portsMu.Unlock()
	if low := ephemeralLow(); low-firstPort >= 1000 {
		for range 100 {
			p := firstPort + rand.IntN(low-firstPort)
			if portsGiven[p] {
				continue
			}
			if l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p)); err == nil {
				l.Close()
				portsGiven[p] = true
				return p, nil
			}
		}
	}
	for range 100 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return 0, err
		}
		p := l.Addr().(*net.TCPAddr).Port
		l.Close()
		if !portsGiven[p] {
			portsGiven[p] = true
			return p, nil
		}
	}
	return 0, errors.New("no free loopback port not handed out before")
}

// firstPort is the lowest port FreePort hands out: above the well-known and most
// registered services' ports.
const firstPort = 20000

var (
	portsMu    sync.Mutex
	portsGiven = map[int]bool{}
)

// ephemeralLow returns the first port of the kernel's ephemeral range, 0 where it cannot
// be read (not Linux).
func ephemeralLow() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 0
	}
	var low, high int
	if _, err := fmt.Sscan(string(b), &low, &high); err != nil {
		return 0
	}
	return low
}

// FreeAddr is FreePort as "127.0.0.1:port".
func FreeAddr() (string, error) {
	p, err := FreePort()
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("127.0.0.1:%d", p), nil
}

// Eventually calls cond every interval until it returns true or an error, or until timeout
// passes (an error naming what). The process p, when given, must keep running meanwhile.
func Eventually(ctx context.Context, timeout, interval time.Duration, what string, p *Process, cond func(context.Context) (bool, error)) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var last error
	for {
		ok, err := cond(ctx)
		if err != nil && !errors.Is(err, errRetry) {
			return fmt.Errorf("%s: %w", what, err)
		}
		if ok {
			return nil
		}
		if err != nil {
			last = err
		}
		if p != nil {
			if exited, err := p.Exited(); exited {
				return fmt.Errorf("%s: %s exited (%v); last lines of its log:\n%s", what, p.Name, err, p.Tail(30))
			}
		}
		select {
		case <-ctx.Done():
			if last != nil {
				return fmt.Errorf("%s: not within %s: %w", what, timeout, last)
			}
			return fmt.Errorf("%s: not within %s", what, timeout)
		case <-time.After(interval):
		}
	}
}

// errRetry marks an error Eventually keeps trying after.
var errRetry = errors.New("not yet")

// Retry wraps err so that Eventually tries again, and reports it if time runs out.
func Retry(err error) error {
	return fmt.Errorf("%w: %w", errRetry, err)
}
