package keda

import (
	"context"

	"bufio"
	"encoding/json"
	"fmt"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gpuscaler/gpuscaler/test/testkit"
)

// process is a gpuscaler command a test started. It runs in its own process group, which
// the test's cleanup ends (SIGTERM, then SIGKILL after stopGrace), pass or fail; the
// kernel kills it too should the test binary die first.
type process struct {
	name   string
	cmd    *exec.Cmd
	out    *logBuffer
	exited chan struct{} // closed once the process has exited; waitErr is set then
	// waitErr is what Wait returned. Written once, before exited is closed.
	waitErr error
}

const stopGrace = 10 * time.Second

// startProcess runs gpuscaler with args. Its output (JSON logs, with --log-format json)
// is kept, and shown when the test fails. cleanTermExit asks the cleanup to fail the test
// unless the process exits 0 on SIGTERM: a graceful stop is part of the contract.
func startProcess(t *testing.T, name string, cleanTermExit bool, args ...string) *process {
	t.Helper()
	cmd := exec.Command(gpuscalerBin, args...)
	out := &logBuffer{}
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	p := &process{name: name, cmd: cmd, out: out, exited: make(chan struct{})}
	go func() {
		p.waitErr = cmd.Wait()
		close(p.exited)
	}()
	t.Cleanup(func() {
		killedEarly := p.stop()
		switch {
		case killedEarly:
			t.Errorf("%s did not exit within %s of SIGTERM; killed it", name, stopGrace)
		case cleanTermExit && p.waitErr != nil:
			t.Errorf("%s exited with %v after SIGTERM, want a clean exit", name, p.waitErr)
		}
		if t.Failed() {
			t.Logf("output of %s (%s):\n%s", name, strings.Join(args, " "), out.String())
		}
	})
	return p
}

// stop ends the process group: SIGTERM, and SIGKILL if it is still there after
// stopGrace. It reports whether SIGKILL was needed. A process that exited on its own is
// left alone.
func (p *process) stop() (killed bool) {
	select {
	case <-p.exited:
		return false
	default:
	}
	pgid := p.cmd.Process.Pid
	_ = syscall.Kill(-pgid, syscall.SIGTERM)
	select {
	case <-p.exited:
		return false
	case <-time.After(stopGrace):
	}
	_ = syscall.Kill(-pgid, syscall.SIGKILL)
	<-p.exited
	return true
}

// waitLog waits until the process logs a JSON line whose msg is msg, and returns it.
func (p *process) waitLog(t *testing.T, msg string, timeout time.Duration) map[string]any {
	t.Helper()
	var line map[string]any
	testkit.Eventually(t, timeout, func(context.Context) error {
		select {
		case <-p.exited:
			t.Fatalf("%s exited (%v) before logging %q; output:\n%s", p.name, p.waitErr, msg, p.out.String())
		default:
		}
		var ok bool
		if line, ok = p.out.find(msg); !ok {
			return fmt.Errorf("%s has not logged %q yet", p.name, msg)
		}
		return nil
	})
	return line
}

// logBuffer collects a process's output (testkit.SyncBuffer: safe for concurrent use)
// and finds its JSON log lines.
type logBuffer struct{ testkit.SyncBuffer }

// find returns the first complete JSON log line whose msg is msg.
func (b *logBuffer) find(msg string) (map[string]any, bool) {
	sc := bufio.NewScanner(strings.NewReader(b.String()))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var line map[string]any
		if json.Unmarshal(sc.Bytes(), &line) == nil && line["msg"] == msg {
			return line, true
		}
	}
	return nil, false
}
