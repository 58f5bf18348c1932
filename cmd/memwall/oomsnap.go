package main

import (
	"bytes"
	"errors"
	"flag"
	"fmt"

	"github.com/memwall/memwall/pool"
	"github.com/memwall/memwall/trace"
)

// oomHistory is how many allocations and frees a pool keeps for the
// snapshot when --oom-snapshot is given (pool.Options.History): enough to
// see the steps before the failure, a few hundred KiB of memory.
const oomHistory = 4096

// oomSnapshot is --oom-snapshot FILE: where the pool's snapshot goes when
// the work fails for want of device memory, for `memwall replay --html` to
// draw. The file is checked before the work, like every output file, and
// written only on an out-of-memory error.
type oomSnapshot struct {
	path string
	out  *outputFile
}

// add registers --oom-snapshot on fs.
func (s *oomSnapshot) add(fs *flag.FlagSet) {
	fs.StringVar(&s.path, "oom-snapshot", "", "when a pool runs out of device memory, write its snapshot (memory map and last events) to `FILE`; memwall replay --html page.html FILE draws it")
}

// check checks the file can be written (see checkOutput); call it before
// the work starts.
func (s *oomSnapshot) check(e *env) error {
	out, err := checkOutput(e.temps, "--oom-snapshot", s.path)
	s.out = out
	return err
}

// history is the pool.Options.History a verb's pools keep: oomHistory when
// a snapshot was asked for, else none (a history costs every allocation an
// event).
func (s *oomSnapshot) history() int {
	if s.out == nil {
		return 0
	}
	return oomHistory
}

// handle passes err through, writing the snapshot an out-of-memory error
// carries when --oom-snapshot was given and saying in the message where it
// went (or, without the flag, how to get one).
func (s *oomSnapshot) handle(err error) error {
	var oom *pool.OOMError
	if err == nil || !errors.As(err, &oom) {
		return err
	}
	switch {
	case s.out == nil && oom.Snapshot != nil:
		return fmt.Errorf("%w (give --oom-snapshot FILE to keep the pool's memory map at the failure)", err)
	case s.out == nil:
		return err
	case oom.Snapshot == nil:
		return fmt.Errorf("%w (no --oom-snapshot %s written: a tenant's quota refused the request, the pool's memory was not short)", err, s.path)
	}
	var buf bytes.Buffer
	if _, werr := trace.WriteSnapshot(&buf, oom.Snapshot); werr != nil {
		return fmt.Errorf("%w; the snapshot for --oom-snapshot %s: %v", err, s.path, werr)
	}
	if werr := s.out.write(buf.Bytes()); werr != nil {
		return fmt.Errorf("%w; %v", err, werr)
	}
	return fmt.Errorf("%w; the pool's snapshot at the failure is in %s (memwall replay --html page.html %s draws it)", err, s.path, s.path)
}

// poolFlags are what a verb that makes pools lets the user keep of them:
// --oom-snapshot (the snapshot of an out-of-memory error) and --pool-log
// (every allocation and free of the device pool, as the event log that
// `memwall replay` reads).
type poolFlags struct {
	snap    oomSnapshot
	logPath string
	logOut  *outputFile
	logBuf  bytes.Buffer
	log     *trace.EventLog
}

// add registers --oom-snapshot and --pool-log on fs.
func (p *poolFlags) add(fs *flag.FlagSet) {
	p.snap.add(fs)
	fs.StringVar(&p.logPath, "pool-log", "", "write every allocation and free of the device pool to `FILE` (JSON lines, written at the end, also when the work fails); memwall replay FILE replays it through other pool configurations")
}

// check checks both files can be written; call it before the work.
func (p *poolFlags) check(e *env) error {
	if err := p.snap.check(e); err != nil {
		return err
	}
	out, err := checkOutput(e.temps, "--pool-log", p.logPath)
	if err != nil {
		return err
	}
	if p.logOut = out; out != nil {
		p.log = trace.NewEventLog(&p.logBuf)
	}
	return nil
}

// outputs are the files given, for checkFiles (nil for a flag not given).
func (p *poolFlags) outputs() []*outputFile {
	return []*outputFile{p.snap.out, p.logOut}
}

// device sets a device pool's options for the flags: the snapshot's
// history, and the log as its event hook. A nil p changes nothing.
func (p *poolFlags) device(o *pool.Options) {
	if p == nil {
		return
	}
	p.host(o)
	if p.log != nil {
		o.OnEvent = p.log.Record
	}
}

// onEvent is the device pool's event hook for the log, nil without
// --pool-log.
func (p *poolFlags) onEvent() func(pool.Event) {
	if p.log == nil {
		return nil
	}
	return p.log.Record
}

// host sets a host pool's options: the snapshot's history only (the log
// holds device addresses alone). A nil p changes nothing.
func (p *poolFlags) host(o *pool.Options) {
	if p != nil {
		o.History = p.snap.history()
	}
}

// finish writes the log (whether the work failed or not) and passes err
// through the snapshot's handle; a failure to write the log is the error
// when the work itself succeeded.
func (p *poolFlags) finish(err error) error {
	if p.log != nil {
		werr := p.log.Flush()
		if werr == nil {
			werr = p.logOut.write(p.logBuf.Bytes())
		}
		if werr != nil && err == nil {
			return werr
		}
		if werr != nil {
			err = fmt.Errorf("%w; --pool-log %s: %v", err, p.logPath, werr)
		}
	}
	return p.snap.handle(err)
}
