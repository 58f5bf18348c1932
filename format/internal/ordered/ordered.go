// Package ordered runs a sequence of jobs on several goroutines and hands
// their results to one writer in order: the shape of every streaming file
// writer in format/ (generated or quantized tensor data, chunk by chunk).
package ordered

import (
	"context"
	"sync"
)

// InFlight is the most jobs Run has between the start of work and the end
// of write for the given number of workers: a caller that gives each job a
// buffer from a pool of this many never waits for one.
func InFlight(workers int) int { return 2*max(workers, 1) + 2 }

// Run calls work(i) for every i in [0, n) on workers goroutines (at least
// one) and write(i) for each, in increasing i, on the calling goroutine once
// work(i) has returned. It stops at the first error of work or write, or at
// ctx's cancellation, and returns that error (ctx's error for the
// cancellation), after every work call it started has returned; write is
// not called after an error.
func Run(ctx context.Context, n, workers int, work func(i int) error, write func(i int) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	workers = max(workers, 1)
	type job struct {
		i    int
		err  error
		done chan struct{}
	}
	queue := make(chan *job)
	order := make(chan *job, InFlight(workers))
	slots := make(chan struct{}, InFlight(workers))
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for j := range queue {
				j.err = work(j.i)
				close(j.done)
			}
		})
	}
	wg.Go(func() {
		defer close(queue)
		defer close(order)
		for i := range n {
			select {
			case slots <- struct{}{}:
			case <-ctx.Done():
				return
			}
			j := &job{i: i, done: make(chan struct{})}
			// Dispatched before it is queued for the writer, so that every
			// job the writer waits for runs.
			select {
			case queue <- j:
			case <-ctx.Done():
				return
			}
			order <- j // room for every slot: never waits
		}
	})
	var err error
	for j := range order {
		select {
		case <-j.done:
		case <-ctx.Done():
		}
		if err = ctx.Err(); err != nil {
			break
		}
		if err = j.err; err != nil {
			break
		}
		if err = write(j.i); err != nil {
			break
		}
		<-slots
	}
	if err == nil {
		err = ctx.Err() // cancelled before the producer queued everything
	}
	cancel()
	for j := range order {
		<-j.done
	}
	wg.Wait()
	return err
}
