//go:build unix

package main

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// TestSIGTERMCancels: SIGTERM cancels newEnv's context as SIGINT does (so
// the verbs' cleanup runs) instead of killing the process, and is recorded
// for the exit status.
func TestSIGTERMCancels(t *testing.T) {
	e := newEnv()
	if err := syscall.Kill(os.Getpid(), syscall.SIGTERM); err != nil {
		t.Skip("cannot signal:", err)
	}
	select {
	case <-e.ctx.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("SIGTERM did not cancel the context")
	}
	if got := e.stop.signalled(); got != syscall.SIGTERM {
		t.Errorf("recorded %v, want SIGTERM", got)
	}
}

// TestOutputFileFIFO: a named pipe is written through (its reader gets the
// bytes) and checking it does not wait for a reader.
func TestOutputFileFIFO(t *testing.T) {
	p := filepath.Join(t.TempDir(), "fifo")
	if err := syscall.Mkfifo(p, 0o644); err != nil {
		t.Skip("no named pipes:", err)
	}
	o, err := checkOutput(nil, "--out", p)
	if err != nil || !o.through {
		t.Fatalf("%v %+v", err, o)
	}
	got := make(chan []byte)
	go func() {
		b, _ := os.ReadFile(p)
		got <- b
	}()
	if err := o.write([]byte("through")); err != nil {
		t.Fatal(err)
	}
	if b := <-got; string(b) != "through" {
		t.Errorf("reader got %q", b)
	}
	if st, _ := os.Lstat(p); st.Mode()&os.ModeNamedPipe == 0 {
		t.Errorf("the pipe was replaced")
	}
}
