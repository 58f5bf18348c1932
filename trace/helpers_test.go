package trace

import (
	"bytes"
	"compress/gzip"
	"encoding/binary"
	"errors"
	"io"
	"math"
	"strings"
	"testing"
)

// readAll reads every event of src, returning them and the error that ended
// the read (nil at io.EOF).
func readAll(t testing.TB, src []byte, name string, opts Options) ([]Event, *Reader, error) {
	t.Helper()
	r, err := NewReader(bytes.NewReader(src), name, opts)
	if err != nil {
		return nil, nil, err
	}
	var evs []Event
	for {
		ev, err := r.Next()
		if err == io.EOF {
			return evs, r, nil
		}
		if err != nil {
			return evs, r, err
		}
		evs = append(evs, ev)
	}
}

// openAll is readAll on a file.
func openAll(t testing.TB, path string, opts Options) ([]Event, *Reader) {
	t.Helper()
	r, err := Open(path, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	var evs []Event
	for {
		ev, err := r.Next()
		if err == io.EOF {
			return evs, r
		}
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		evs = append(evs, ev)
	}
}

func gzipBytes(t testing.TB, b []byte) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	if _, err := zw.Write(b); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// wantError checks that err wraps sentinel, is an *Error, and that its
// message holds every one of parts.
func wantError(t *testing.T, err, sentinel error, parts ...string) {
	t.Helper()
	if err == nil {
		t.Fatalf("no error, want %v", sentinel)
	}
	if !errors.Is(err, sentinel) {
		t.Fatalf("error %q does not wrap %q", err, sentinel)
	}
	var e *Error
	if !errors.As(err, &e) {
		t.Fatalf("error %q is not a *trace.Error", err)
	}
	for _, p := range parts {
		if !strings.Contains(err.Error(), p) {
			t.Errorf("error %q does not mention %q", err, p)
		}
	}
}

// pk builds pickles opcode by opcode, the way Python's pickler writes them.
type pk struct{ b []byte }

func newPK(proto byte) *pk { return &pk{b: []byte{0x80, proto}} }

func (p *pk) op(ops ...byte) *pk { p.b = append(p.b, ops...); return p }
func (p *pk) mark() *pk          { return p.op('(') }
func (p *pk) dict() *pk          { return p.op('}') }
func (p *pk) list() *pk          { return p.op(']') }
func (p *pk) appends() *pk       { return p.op('e') }
func (p *pk) setitems() *pk      { return p.op('u') }
func (p *pk) stop() []byte       { return p.op('.').b }
func (p *pk) memoize() *pk       { return p.op(0x94) }

func (p *pk) str(s string) *pk {
	if len(s) < 256 {
		p.b = append(p.b, 0x8c, byte(len(s)))
	} else {
		p.b = append(p.b, 'X')
		p.b = binary.LittleEndian.AppendUint32(p.b, uint32(len(s)))
	}
	p.b = append(p.b, s...)
	return p
}

// int writes n as Python does: BININT1, BININT2, BININT or LONG1.
func (p *pk) int(n int64) *pk {
	switch {
	case n >= 0 && n < 256:
		return p.op('K', byte(n))
	case n >= 0 && n < 65536:
		return p.op('M', byte(n), byte(n>>8))
	case n >= -1<<31 && n < 1<<31:
		p.b = append(p.b, 'J')
		p.b = binary.LittleEndian.AppendUint32(p.b, uint32(int32(n)))
		return p
	}
	p.b = append(p.b, 0x8a, 8)
	p.b = binary.LittleEndian.AppendUint64(p.b, uint64(n))
	return p
}

// entry writes one trace-entry dict with the given key/value pairs (string
// values become str, int64 values int).
func (p *pk) entry(kv ...any) *pk {
	p.dict().memoize().mark()
	for i := 0; i < len(kv); i += 2 {
		p.str(kv[i].(string))
		switch v := kv[i+1].(type) {
		case string:
			p.str(v)
		case int:
			p.int(int64(v))
		case int64:
			p.int(v)
		case []byte: // a LONG1 of these bytes
			p.op(0x8a, byte(len(v))).op(v...)
		case float64:
			p.b = binary.BigEndian.AppendUint64(append(p.b, 'G'), math.Float64bits(v))
		default:
			panic("pk.entry: unsupported value")
		}
	}
	return p.setitems()
}

// snapshotPickle returns a whole snapshot pickle whose only device holds
// the given entries (each a list of key/value pairs for pk.entry), appended
// in batches of 1000 as Python's pickler does.
func snapshotPickle(entries ...[]any) []byte {
	p := newPK(4).dict().memoize().mark()
	p.str("segments").list().memoize()
	p.str("device_traces").list().memoize().list().memoize()
	for len(entries) > 0 {
		batch := entries[:min(len(entries), 1000)]
		entries = entries[len(batch):]
		if len(batch) == 1 {
			p.entry(batch[0]...).op('a')
			continue
		}
		p.mark()
		for _, e := range batch {
			p.entry(e...)
		}
		p.appends()
	}
	p.op('a') // the device list into device_traces
	return p.setitems().stop()
}

func alloc(addr, size int64) []any {
	return []any{"action", "alloc", "addr", addr, "size", size, "stream", 0, "time_us", 5}
}
