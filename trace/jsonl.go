package trace

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"strconv"
	"sync"
	"unicode/utf8"
)

// The JSON-lines format is described in the package doc.

// maxTenants bounds the tenant and purpose strings a decoder interns;
// beyond it each label costs an allocation.
const maxTenants = 4096

// maxJSONDepth bounds the nesting of skipped (unknown) values.
const maxJSONDepth = 32

type jsonlDecoder struct {
	br      *bufio.Reader
	line    int64
	n       int64
	names   map[string]string // interned tenant and purpose labels
	scratch []byte            // unescaped strings
}

func newJSONLDecoder(br *bufio.Reader) *jsonlDecoder {
	return &jsonlDecoder{br: br, names: make(map[string]string)}
}

func (d *jsonlDecoder) pos() Pos        { return Pos{Line: max(d.line, 1)} }
func (d *jsonlDecoder) consumed() int64 { return d.n }

func (d *jsonlDecoder) next(ev *Event) error {
	for {
		b, err := readLine(d.br, &d.line, &d.n)
		if err != nil {
			return err
		}
		p := jsonParser{b: b, d: d}
		p.ws()
		if p.i == len(p.b) {
			continue
		}
		return p.event(ev)
	}
}

// intern returns b as a string, shared with earlier equal labels.
func (d *jsonlDecoder) intern(b []byte) string {
	if s, ok := d.names[string(b)]; ok {
		return s
	}
	s := string(b)
	if len(d.names) < maxTenants {
		d.names[s] = s
	}
	return s
}

// jsonParser parses one line: a flat JSON object.
type jsonParser struct {
	b []byte
	i int
	d *jsonlDecoder
}

var errUnterminated = errors.New("unterminated")

func (p *jsonParser) malformed(format string, args ...any) error {
	return fmt.Errorf("%w: %s (column %d)", ErrMalformed, fmt.Sprintf(format, args...), p.i+1)
}

func (p *jsonParser) ws() {
	for p.i < len(p.b) {
		switch p.b[p.i] {
		case ' ', '\t', '\r', '\n':
			p.i++
		default:
			return
		}
	}
}

func (p *jsonParser) eat(c byte) bool {
	if p.i < len(p.b) && p.b[p.i] == c {
		p.i++
		return true
	}
	return false
}

// event parses the object into ev.
func (p *jsonParser) event(ev *Event) error {
	if !p.eat('{') {
		return p.malformed("want a JSON object")
	}
	const (
		hasAction = 1 << iota
		hasAddr
		hasSize
	)
	var have uint8
	var action []byte // unknown action name, reported after the line parsed
	unknown, ignored := false, false
	p.ws()
	if !p.eat('}') {
		for {
			p.ws()
			key, err := p.str()
			if err != nil {
				return err
			}
			p.ws()
			if !p.eat(':') {
				return p.malformed("want ':' after key %q", clip(key))
			}
			p.ws()
			switch string(key) {
			case "t":
				ev.Time, err = p.int64()
			case "action":
				var s []byte
				if s, err = p.str(); err == nil {
					have |= hasAction
					var ok bool
					if ev.Action, ok, ignored = parseActionBytes(s); !ok && !ignored {
						unknown, action = true, append([]byte(nil), clip(s)...)
					}
				}
			case "addr":
				have |= hasAddr
				ev.Addr, err = p.uint64("addr")
			case "size":
				have |= hasSize
				ev.Size, err = p.uint64("size")
			case "stream":
				ev.Stream, err = p.uint64("stream")
			case "device":
				var v uint64
				v, err = p.uint64("device")
				if err == nil && v > 1<<20 {
					err = p.malformed("device %d out of range", v)
				}
				ev.Device = int(v)
			case "device_free":
				ev.DeviceFree, err = p.uint64("device_free")
			case "tenant", "purpose":
				var s []byte
				if s, err = p.str(); err == nil {
					if key[0] == 't' {
						ev.Tenant = p.d.intern(s)
					} else {
						ev.Purpose = p.d.intern(s)
					}
				}
			default:
				err = p.skip(0)
			}
			if err != nil {
				return err
			}
			p.ws()
			if p.eat(',') {
				continue
			}
			if p.eat('}') {
				break
			}
			return p.malformed("want ',' or '}'")
		}
	}
	p.ws()
	if p.i != len(p.b) {
		return p.malformed("data after the object")
	}
	switch {
	case have&hasAction == 0:
		return p.malformed("missing \"action\"")
	case unknown:
		return fmt.Errorf("%w: %q", ErrUnknownAction, action)
	case ignored:
		return errIgnored
	case have&hasAddr == 0 && ev.Action != OOM:
		return p.malformed("missing \"addr\"")
	case have&hasSize == 0:
		return p.malformed("missing \"size\"")
	case ev.Size > MaxSize && ev.Action != OOM:
		return fmt.Errorf("%w: %s size %d exceeds %d", ErrBadSize, ev.Action, ev.Size, uint64(MaxSize))
	}
	return nil
}

// str parses a JSON string and returns its contents, which are valid until
// the next call (escaped strings are decoded into the decoder's scratch).
func (p *jsonParser) str() ([]byte, error) {
	if !p.eat('"') {
		return nil, p.malformed("want a string")
	}
	start := p.i
	for p.i < len(p.b) {
		switch c := p.b[p.i]; {
		case c == '"':
			p.i++
			return p.b[start : p.i-1], nil
		case c == '\\':
			return p.unescape(start)
		case c < 0x20:
			return nil, p.malformed("control character in string")
		}
		p.i++
	}
	return nil, p.malformed("%v string", errUnterminated)
}

// unescape decodes a string holding escapes, from start (just after the
// opening quote) on; p.i is at the first backslash.
func (p *jsonParser) unescape(start int) ([]byte, error) {
	out := append(p.d.scratch[:0], p.b[start:p.i]...)
	for p.i < len(p.b) {
		c := p.b[p.i]
		switch {
		case c == '"':
			p.i++
			p.d.scratch = out
			return out, nil
		case c < 0x20:
			return nil, p.malformed("control character in string")
		case c != '\\':
			out = append(out, c)
			p.i++
			continue
		}
		if p.i+1 >= len(p.b) {
			break
		}
		e := p.b[p.i+1]
		p.i += 2
		switch e {
		case '"', '\\', '/':
			out = append(out, e)
		case 'b':
			out = append(out, '\b')
		case 'f':
			out = append(out, '\f')
		case 'n':
			out = append(out, '\n')
		case 'r':
			out = append(out, '\r')
		case 't':
			out = append(out, '\t')
		case 'u':
			if p.i+4 > len(p.b) {
				return nil, p.malformed("short \\u escape")
			}
			v, err := strconv.ParseUint(string(p.b[p.i:p.i+4]), 16, 16)
			if err != nil {
				return nil, p.malformed("bad \\u escape %q", p.b[p.i:p.i+4])
			}
			p.i += 4
			out = utf8.AppendRune(out, rune(v)) // lone surrogates become U+FFFD
		default:
			return nil, p.malformed("bad escape \\%c", e)
		}
	}
	return nil, p.malformed("%v string", errUnterminated)
}

// digits returns the run of digits at p.i, after an optional '-'.
func (p *jsonParser) digits() (neg bool, d []byte, err error) {
	neg = p.eat('-')
	start := p.i
	for p.i < len(p.b) && p.b[p.i]-'0' <= 9 {
		p.i++
	}
	d = p.b[start:p.i]
	if len(d) == 0 {
		return neg, nil, p.malformed("want an integer")
	}
	if p.i < len(p.b) {
		switch p.b[p.i] {
		case '.', 'e', 'E':
			return neg, nil, p.malformed("want an integer, not a fraction")
		}
	}
	return neg, d, nil
}

func (p *jsonParser) uint64(field string) (uint64, error) {
	neg, d, err := p.digits()
	if err != nil {
		return 0, err
	}
	if neg {
		if field == "size" {
			return 0, fmt.Errorf("%w: negative size -%s", ErrBadSize, clip(d))
		}
		return 0, p.malformed("negative %s", field)
	}
	var v uint64
	for _, c := range d {
		c -= '0'
		if v > (1<<64-1-uint64(c))/10 {
			return 0, p.malformed("%s overflows 64 bits", field)
		}
		v = v*10 + uint64(c)
	}
	return v, nil
}

func (p *jsonParser) int64() (int64, error) {
	neg, d, err := p.digits()
	if err != nil {
		return 0, err
	}
	var v uint64
	for _, c := range d {
		c -= '0'
		if v > (1<<63-uint64(c))/10 {
			return 0, p.malformed("t overflows 64 bits")
		}
		v = v*10 + uint64(c)
	}
	if neg {
		return -int64(v), nil
	}
	if v > 1<<63-1 {
		return 0, p.malformed("t overflows 64 bits")
	}
	return int64(v), nil
}

// skip skips one JSON value of any kind.
func (p *jsonParser) skip(depth int) error {
	if depth > maxJSONDepth {
		return fmt.Errorf("%w: values nested deeper than %d", ErrMalformed, maxJSONDepth)
	}
	if p.i >= len(p.b) {
		return p.malformed("want a value")
	}
	switch c := p.b[p.i]; {
	case c == '"':
		_, err := p.str()
		return err
	case c == '-' || c-'0' <= 9:
		p.i++
		for p.i < len(p.b) {
			switch p.b[p.i] {
			case '0', '1', '2', '3', '4', '5', '6', '7', '8', '9', '.', 'e', 'E', '+', '-':
				p.i++
				continue
			}
			break
		}
		return nil
	case c == '{' || c == '[':
		end := byte('}')
		if c == '[' {
			end = ']'
		}
		p.i++
		p.ws()
		if p.eat(end) {
			return nil
		}
		for {
			p.ws()
			if c == '{' {
				if _, err := p.str(); err != nil {
					return err
				}
				p.ws()
				if !p.eat(':') {
					return p.malformed("want ':'")
				}
				p.ws()
			}
			if err := p.skip(depth + 1); err != nil {
				return err
			}
			p.ws()
			if p.eat(',') {
				continue
			}
			if p.eat(end) {
				return nil
			}
			return p.malformed("want ',' or %q", end)
		}
	}
	for _, lit := range [...]string{"true", "false", "null"} {
		if len(p.b)-p.i >= len(lit) && string(p.b[p.i:p.i+len(lit)]) == lit {
			p.i += len(lit)
			return nil
		}
	}
	return p.malformed("want a value")
}

// Writer writes memwall's JSON-lines event log, the format NewReader reads
// back. Lines are buffered: call Flush before the underlying writer is
// closed. Write is safe for concurrent use (lines never interleave) and
// does not allocate once its line buffer has grown.
type Writer struct {
	mu  sync.Mutex
	bw  *bufio.Writer
	buf []byte
	err error
}

// NewWriter returns a Writer that appends to w.
func NewWriter(w io.Writer) *Writer {
	return &Writer{bw: bufio.NewWriterSize(w, 64<<10), buf: make([]byte, 0, 256)}
}

// Write appends ev as one line. It returns an error for an event the format
// cannot hold (an invalid Action, a negative Device) without writing it;
// errors from the underlying writer are sticky and returned by every later
// Write and Flush.
func (w *Writer) Write(ev Event) error {
	if ev.Action == ActionInvalid || ev.Action >= numActions {
		return fmt.Errorf("trace: writing event: invalid action %d", ev.Action)
	}
	if ev.Device < 0 {
		return fmt.Errorf("trace: writing event: negative device %d", ev.Device)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.err != nil {
		return w.err
	}
	b := w.buf[:0]
	b = append(b, `{"t":`...)
	b = strconv.AppendInt(b, ev.Time, 10)
	b = append(b, `,"action":"`...)
	b = append(b, ev.Action.String()...)
	b = append(b, `","addr":`...)
	b = strconv.AppendUint(b, ev.Addr, 10)
	b = append(b, `,"size":`...)
	b = strconv.AppendUint(b, ev.Size, 10)
	b = append(b, `,"stream":`...)
	b = strconv.AppendUint(b, ev.Stream, 10)
	if ev.Device != 0 {
		b = append(b, `,"device":`...)
		b = strconv.AppendUint(b, uint64(ev.Device), 10)
	}
	if ev.Action == OOM {
		b = append(b, `,"device_free":`...)
		b = strconv.AppendUint(b, ev.DeviceFree, 10)
	}
	if ev.Tenant != "" {
		b = append(b, `,"tenant":`...)
		b = appendJSONString(b, ev.Tenant)
	}
	if ev.Purpose != "" {
		b = append(b, `,"purpose":`...)
		b = appendJSONString(b, ev.Purpose)
	}
	b = append(b, "}\n"...)
	w.buf = b
	if _, err := w.bw.Write(b); err != nil {
		w.err = fmt.Errorf("trace: writing event log: %w", err)
		return w.err
	}
	return nil
}

// Flush writes buffered lines to the underlying writer.
func (w *Writer) Flush() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.err != nil {
		return w.err
	}
	if err := w.bw.Flush(); err != nil {
		w.err = fmt.Errorf("trace: writing event log: %w", err)
	}
	return w.err
}

// appendJSONString appends s as a JSON string; invalid UTF-8 becomes
// U+FFFD.
func appendJSONString(b []byte, s string) []byte {
	const hex = "0123456789abcdef"
	b = append(b, '"')
	for i := 0; i < len(s); {
		c := s[i]
		if c >= 0x20 && c != '"' && c != '\\' && c < utf8.RuneSelf {
			b = append(b, c)
			i++
			continue
		}
		if c < utf8.RuneSelf {
			switch c {
			case '"', '\\':
				b = append(b, '\\', c)
			case '\n':
				b = append(b, '\\', 'n')
			case '\t':
				b = append(b, '\\', 't')
			case '\r':
				b = append(b, '\\', 'r')
			default:
				b = append(b, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
			}
			i++
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			b = append(b, `\ufffd`...)
		} else {
			b = append(b, s[i:i+size]...)
		}
		i += size
	}
	return append(b, '"')
}
