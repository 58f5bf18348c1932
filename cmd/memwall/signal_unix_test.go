//go:build unix

package main

import (
	"bytes"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// buildMemwall builds the command into a temporary directory.
func buildMemwall(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("builds the binary")
	}
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command to build with:", err)
	}
	bin := filepath.Join(t.TempDir(), "memwall")
	cmd := exec.Command(goTool, "build", "-pgo=off", "-o", bin, ".")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// lockedBuffer is a buffer a process writes while the test reads it.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// memwallProcess is the binary running.
type memwallProcess struct {
	cmd            *exec.Cmd
	stdout, stderr *lockedBuffer
	done           chan struct{} // closed when it exited
}

// startMemwall starts the binary; it is killed at the test's end if it
// still runs.
func startMemwall(t *testing.T, bin string, args ...string) *memwallProcess {
	t.Helper()
	p := &memwallProcess{cmd: exec.Command(bin, args...), stdout: &lockedBuffer{}, stderr: &lockedBuffer{}, done: make(chan struct{})}
	p.cmd.Stdout, p.cmd.Stderr = p.stdout, p.stderr
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		p.cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		if !p.exited() {
			p.cmd.Process.Kill()
			<-p.done
		}
	})
	return p
}

func (p *memwallProcess) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// wait returns the exit status and how long after since it came, failing
// the test past limit.
func (p *memwallProcess) wait(t *testing.T, since time.Time, limit time.Duration) (int, time.Duration) {
	t.Helper()
	select {
	case <-p.done:
	case <-time.After(limit):
		t.Fatalf("memwall %v still running %v after the signal; stderr %q", p.cmd.Args[1:], limit, p.stderr.String())
	}
	return p.cmd.ProcessState.ExitCode(), time.Since(since)
}

// TestSignalsBinary: the built binary, given a real SIGINT or SIGTERM in
// the middle of bench kv's billion ops, exits 130 or 143 within a couple
// of seconds saying so; and a second SIGINT exits at once when the first
// cannot stop the work (a write to a pipe nobody reads).
func TestSignalsBinary(t *testing.T) {
	bin := buildMemwall(t)
	for _, sig := range []syscall.Signal{syscall.SIGINT, syscall.SIGTERM} {
		t.Run(signalName(sig), func(t *testing.T) {
			p := startMemwall(t, bin, "bench", "kv", "--blocks", "1000", "--ops", "1000000000", "--no-swap")
			time.Sleep(500 * time.Millisecond) // into the timed loops
			sent := time.Now()
			if err := p.cmd.Process.Signal(sig); err != nil {
				t.Fatal(err)
			}
			code, took := p.wait(t, sent, 5*time.Second)
			if code != signalStatus(sig) || took > 2*time.Second {
				t.Errorf("exit %d %v after the signal; want %d within 2s", code, took, signalStatus(sig))
			}
			if want := "memwall bench kv: interrupted by " + signalName(sig); !strings.HasPrefix(p.stderr.String(), want) {
				t.Errorf("stderr %q, want %q…", p.stderr.String(), want)
			}
		})
	}
	t.Run("second SIGINT", func(t *testing.T) {
		fifo := filepath.Join(t.TempDir(), "plan.json")
		if err := syscall.Mkfifo(fifo, 0o644); err != nil {
			t.Skip("no named pipes:", err)
		}
		lifetimes := filepath.Join("..", "..", "testdata", "minimalloc", "A.1048576.csv")
		p := startMemwall(t, bin, "plan", "--lifetimes", lifetimes, "--time-limit", "0s", "--out", fifo)
		// --out is written before the report is printed: once the plan is
		// made the command waits for the pipe's reader, printing nothing.
		// The plan takes well under a second; give it two.
		time.Sleep(2 * time.Second)
		if p.exited() || p.stdout.String() != "" {
			t.Fatalf("plan did not block on --out (stdout %q, stderr %q)", p.stdout.String(), p.stderr.String())
		}
		time.Sleep(100 * time.Millisecond)
		if err := p.cmd.Process.Signal(syscall.SIGINT); err != nil {
			t.Fatal(err)
		}
		time.Sleep(300 * time.Millisecond)
		if p.exited() {
			t.Fatalf("the first SIGINT stopped a write to a pipe (stderr %q): the test proves nothing", p.stderr.String())
		}
		sent := time.Now()
		if err := p.cmd.Process.Signal(syscall.SIGINT); err != nil {
			t.Fatal(err)
		}
		code, took := p.wait(t, sent, 5*time.Second)
		if code != exitSIGINT || took > time.Second {
			t.Errorf("exit %d %v after the second SIGINT; want %d at once", code, took, exitSIGINT)
		}
		if got := p.stderr.String(); got != "memwall: SIGINT after SIGINT: exiting at once\n" {
			t.Errorf("stderr %q", got)
		}
	})
}
