//go:build unix

package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestTempFilesRegistry: a file or directory is registered from the moment
// it is made until it is renamed into place or removed; removeAll removes
// what is still registered and refuses to make or rename anything after.
func TestTempFilesRegistry(t *testing.T) {
	dir := t.TempDir()
	var r tempFiles
	kept, err := r.CreateTemp(dir, ".kept.*.tmp")
	if err != nil {
		t.Fatal(err)
	}
	kept.Close()
	renamed, err := r.CreateTemp(dir, ".renamed.*.tmp")
	if err != nil {
		t.Fatal(err)
	}
	renamed.Close()
	sub, err := r.MkdirTemp(dir, "pipe-")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(sub, "copy"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	if n := r.registered(); n != 3 {
		t.Fatalf("%d registered, want 3", n)
	}
	final := filepath.Join(dir, "final")
	if err := r.Rename(renamed.Name(), final); err != nil {
		t.Fatal(err)
	}
	if n := r.registered(); n != 2 {
		t.Fatalf("%d registered after a rename, want 2", n)
	}
	r.removeAll()
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 || entries[0].Name() != "final" {
		t.Errorf("after removeAll the directory holds %v, want the renamed file alone", entries)
	}
	if _, err := r.CreateTemp(dir, "late.*"); !errors.Is(err, errExiting) {
		t.Errorf("CreateTemp after removeAll: %v, want errExiting", err)
	}
	if _, err := r.MkdirTemp(dir, "late-"); !errors.Is(err, errExiting) {
		t.Errorf("MkdirTemp after removeAll: %v, want errExiting", err)
	}
	// A nil registry makes and removes files without registering them.
	var none *tempFiles
	f, err := none.CreateTemp(dir, "plain.*")
	if err != nil {
		t.Fatal(err)
	}
	f.Close()
	if err := none.Remove(f.Name()); err != nil {
		t.Fatal(err)
	}
}

// TestSecondSignalRemovesTemps: the second signal exits at once, without
// waiting for the work's cleanup, and still removes the temporary files
// the run registered: the copy in $TMPDIR of a model read from a pipe,
// part copied, and gen-model's temporary model file, part written.
func TestSecondSignalRemovesTemps(t *testing.T) {
	t.Run("pipe copy", func(t *testing.T) {
		tmp := t.TempDir()
		t.Setenv("TMPDIR", tmp)
		fifo := filepath.Join(t.TempDir(), "m.gguf")
		if err := syscall.Mkfifo(fifo, 0o644); err != nil {
			t.Skip("no named pipes:", err)
		}
		e, temps, stderr := signalEnv()
		// The copy stops at the first signal, so the test holds the work
		// back: the handler runs between the two signals as if the
		// cleanup had not started yet.
		release := make(chan struct{})
		e.ctx = holdCancel(e.ctx, release)
		done := make(chan int, 1)
		go func() { done <- run([]string{"fit", fifo, "--vram", "1GiB"}, e) }()
		w, err := os.OpenFile(fifo, os.O_WRONLY, 0) // waits for fit to open it
		if err != nil {
			t.Fatal(err)
		}
		defer func() {
			close(release)
			w.Close() // fit's read ends, and the run with it
			<-done
		}()
		if _, err := w.Write([]byte("\x08\x07")); err != nil {
			t.Fatal(err)
		}
		waitFor(t, func() bool { return temps.registered() == 1 }, "the pipe's copy registered")
		code := signalTwice(t, e, temps, stderr, done, func() bool { return len(readDir(tmp)) != 0 })
		if code != exitSIGINT {
			t.Errorf("exit %d, want %d", code, exitSIGINT)
		}
		if left := readDir(tmp); len(left) != 0 {
			t.Errorf("the second signal left %v in $TMPDIR", left)
		}
	})
	t.Run("gen-model", func(t *testing.T) {
		if testing.Short() {
			t.Skip("writes part of a 13 GB model")
		}
		dir := t.TempDir()
		e, temps, stderr := signalEnv()
		// As above: the model's write stops at the first signal.
		cancelled := make(chan struct{})
		e.ctx = holdCancel(e.ctx, cancelled)
		done := make(chan int, 1)
		go func() {
			done <- run([]string{"gen-model", "--preset", "llama-7b", "--out", filepath.Join(dir, "model.safetensors")}, e)
		}()
		defer func() {
			close(cancelled)
			<-done
		}()
		waitFor(t, func() bool { return temps.registered() >= 1 && hasTemp(dir) }, "a temporary model file")
		code := signalTwice(t, e, temps, stderr, done, func() bool { return hasTemp(dir) })
		if code != exitSIGINT {
			t.Errorf("exit %d, want %d", code, exitSIGINT)
		}
		if left := readDir(dir); len(left) != 0 {
			t.Errorf("the second signal left %v", left)
		}
	})
}

// signalEnv is an env over buffers that signals interrupt, with a
// registry of temporary files.
func signalEnv() (*env, *tempFiles, *lockedBuffer) {
	ctx, stop := interruptible(context.Background())
	temps := &tempFiles{}
	stderr := &lockedBuffer{}
	return &env{ctx: ctx, stop: stop, stdout: &bytes.Buffer{}, stderr: &lockedBuffer{}, getenv: func(string) string { return "" }, temps: temps}, temps, stderr
}

// signalTwice sends SIGINT through handleSignals, checks that the run goes
// on (done, buffered, is empty) and that before() still holds, sends a second SIGINT
// and returns the exit status the handler asked for.
func signalTwice(t *testing.T, e *env, temps *tempFiles, stderr *lockedBuffer, done chan int, before func() bool) int {
	t.Helper()
	sigs := make(chan os.Signal)
	exited := make(chan int, 1)
	go handleSignals(sigs, e.stop, temps, stderr, func(code int) { exited <- code })
	sigs <- os.Interrupt
	time.Sleep(200 * time.Millisecond)
	if len(done) != 0 {
		t.Fatal("the first signal ended the run: the test proves nothing")
	}
	if !before() {
		t.Fatal("the temporary files were gone before the second signal: the test proves nothing")
	}
	sigs <- os.Interrupt
	select {
	case code := <-exited:
		if got := stderr.String(); !strings.Contains(got, "SIGINT after SIGINT: exiting at once") {
			t.Errorf("stderr %q", got)
		}
		return code
	case <-time.After(5 * time.Second):
		t.Fatal("the second signal did not exit")
	}
	return 0
}

// holdCancel is ctx with its cancellation hidden until release is closed.
func holdCancel(ctx context.Context, release <-chan struct{}) context.Context {
	held, cancel := context.WithCancel(context.WithoutCancel(ctx))
	go func() {
		<-release
		cancel()
	}()
	return held
}

func waitFor(t *testing.T, cond func() bool, what string) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("no %s within 10s", what)
		}
	}
}

func readDir(dir string) []string {
	entries, _ := os.ReadDir(dir)
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	return names
}

func hasTemp(dir string) bool {
	for _, n := range readDir(dir) {
		if strings.Contains(n, ".tmp") {
			return true
		}
	}
	return false
}
