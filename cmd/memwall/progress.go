package main

import (
	"fmt"
	"io"
	"time"
)

// progress draws a one-line progress bar on stderr, only when stdout is a
// terminal; otherwise it is silent. Either way it records how far the work
// got in the env, for the message of an interrupted run.
type progress struct {
	w     io.Writer
	on    bool
	label string
	// unit is what done and total count ("rows"; "bytes" prints sizes);
	// "steps" unless the verb sets it.
	unit string
	work *workDone
}

func newProgress(e *env, label string) *progress {
	return &progress{w: e.stderr, on: e.terminal, label: label, unit: "steps", work: &e.work}
}

// update shows done/total with an optional note.
func (p *progress) update(done, total float64, note string) {
	if p.work != nil {
		p.work.set(done, total, p.unit)
	}
	if !p.on || total <= 0 {
		return
	}
	const width = 30
	f := done / total
	if f > 1 {
		f = 1
	}
	n := int(f * width)
	bar := make([]byte, width)
	for i := range bar {
		if i < n {
			bar[i] = '#'
		} else {
			bar[i] = '.'
		}
	}
	fmt.Fprintf(p.w, "\r%s [%s] %3.0f%% %-30s", p.label, bar, f*100, note)
}

// done clears the line.
func (p *progress) done() {
	if p.on {
		fmt.Fprintf(p.w, "\r%-80s\r", "")
	}
}

// ticking shows a bar that fills over limit, the most the work may take,
// refreshed every tick while the work runs (only when stdout is a
// terminal, like every bar); stop clears it. For work that reports no
// progress of its own but is bounded in time, such as the offset search.
func ticking(e *env, label, note string, limit time.Duration) (stop func()) {
	p := newProgress(e, label)
	p.work = nil // time passed, not work done
	if !p.on || limit <= 0 {
		return func() {}
	}
	done := make(chan struct{})
	finished := make(chan struct{})
	t0 := time.Now()
	go func() {
		defer close(finished)
		tk := time.NewTicker(250 * time.Millisecond)
		defer tk.Stop()
		for {
			p.update(float64(time.Since(t0)), float64(limit), note)
			select {
			case <-done:
				return
			case <-tk.C:
			}
		}
	}()
	return func() {
		close(done)
		<-finished
		p.done()
	}
}
