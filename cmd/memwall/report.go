package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
)

// reportWriter is the process's stdout as the verbs write their reports:
// it keeps the first write error and drops what is written after it, so
// that a reader that went away (`memwall ... | head`) ends the command once,
// quietly, instead of failing every line or killing the process. The verb
// goes on to its end (its files are written); status then makes the exit
// status a failure.
type reportWriter struct {
	f   *os.File
	err error
}

// newReportWriter makes e.stdout a reportWriter over the process's stdout,
// and makes a write to a closed pipe fail with EPIPE instead of killing
// the process: Go's runtime dies of SIGPIPE on a write to a broken pipe on
// descriptors 1 and 2 unless the program asks for the signal
// (os/signal's documentation), and memwall asks for it, and ignores it. A
// handled signal, unlike an ignored one, is not inherited by programs the
// process starts.
func newReportWriter(e *env) *reportWriter {
	signal.Notify(make(chan os.Signal, 1), syscall.SIGPIPE)
	w := &reportWriter{f: os.Stdout}
	e.stdout = w
	return w
}

func (w *reportWriter) Write(p []byte) (int, error) {
	if w.err != nil {
		return len(p), nil
	}
	if _, err := w.f.Write(p); err != nil {
		w.err = err
	}
	return len(p), nil
}

// status is the exit status of a verb that returned code, once its report
// was written: a report that could not be written all is a failure (exit
// status 1), without a message when its reader closed the pipe (EPIPE),
// with the error otherwise (a full disk).
func (w *reportWriter) status(e *env, code int) int {
	if w.err == nil {
		return code
	}
	if !errors.Is(w.err, syscall.EPIPE) {
		fmt.Fprintf(e.stderr, "memwall: writing to stdout: %v\n", pathErr(w.err))
	}
	if code == exitOK {
		return exitFail
	}
	return code
}

// stdoutFile is the file under a verb's stdout, nil when it is not one (a
// buffer in tests).
func stdoutFile(w io.Writer) *os.File {
	switch w := w.(type) {
	case *os.File:
		return w
	case *reportWriter:
		return w.f
	}
	return nil
}
