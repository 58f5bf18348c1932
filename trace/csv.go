package trace

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
)

// csvHeader is the first line of a CSV trace.
const csvHeader = "action,addr,size,stream"

// maxLine is the longest line the text formats accept (the bufio buffer).
const maxLine = 64 << 10

// csvDecoder parses "action,addr,size,stream" lines straight from the
// bufio buffer: no allocation per line unless the line is bad.
type csvDecoder struct {
	br     *bufio.Reader
	line   int64 // line number of the record last read
	n      int64 // bytes consumed
	header bool  // header line seen
}

func newCSVDecoder(br *bufio.Reader) *csvDecoder { return &csvDecoder{br: br} }

func (d *csvDecoder) pos() Pos        { return Pos{Line: max(d.line, 1)} }
func (d *csvDecoder) consumed() int64 { return d.n }

func (d *csvDecoder) next(ev *Event) error {
	for {
		b, err := readLine(d.br, &d.line, &d.n)
		if err != nil {
			if err == io.EOF && !d.header {
				return fmt.Errorf("%w: no header line (want %q)", ErrFormat, csvHeader)
			}
			return err
		}
		if !d.header {
			b = bytes.TrimPrefix(b, []byte("\xef\xbb\xbf"))
			if string(b) != csvHeader {
				return fmt.Errorf("%w: header %q, want %q", ErrFormat, clip(b), csvHeader)
			}
			d.header = true
			continue
		}
		if len(b) == 0 {
			continue
		}
		return parseCSVRecord(b, ev)
	}
}

// readLine returns the next line without its "\n" or "\r\n", advancing
// *line and *n. The slice points into br's buffer and is valid until the
// next read. It returns io.EOF at the end, ErrLimit for a line longer than
// maxLine, and read errors (a cut gzip stream: ErrTruncated) as they come,
// with *line naming the line being read.
func readLine(br *bufio.Reader, line, n *int64) ([]byte, error) {
	b, err := br.ReadSlice('\n')
	if err != nil {
		switch {
		case err == io.EOF && len(b) > 0:
			// A last line without its newline.
		case err == io.EOF:
			return nil, io.EOF
		case err == bufio.ErrBufferFull:
			*line++
			return nil, fmt.Errorf("%w: line longer than %d bytes", ErrLimit, maxLine)
		default:
			*line++
			return nil, fmt.Errorf("reading line: %w", err)
		}
	}
	*line++
	*n += int64(len(b))
	if len(b) > 0 && b[len(b)-1] == '\n' {
		b = b[:len(b)-1]
	}
	if len(b) > 0 && b[len(b)-1] == '\r' {
		b = b[:len(b)-1]
	}
	return b, nil
}

// parseCSVRecord parses one "action,addr,size,stream" line into ev.
func parseCSVRecord(b []byte, ev *Event) error {
	i := bytes.IndexByte(b, ',')
	if i < 0 {
		return fmt.Errorf("%w: %q: want 4 fields %s", ErrMalformed, clip(b), csvHeader)
	}
	a, ok, ignored := parseActionBytes(b[:i])
	if !ok {
		if ignored {
			return errIgnored
		}
		return fmt.Errorf("%w: %q", ErrUnknownAction, clip(b[:i]))
	}
	ev.Action = a
	rest := b[i+1:]
	var err error
	if ev.Addr, rest, err = csvUint(rest, "addr", b); err != nil {
		return err
	}
	if ev.Size, rest, err = csvUint(rest, "size", b); err != nil {
		return err
	}
	if ev.Stream, rest, err = csvUint(rest, "stream", b); err != nil {
		return err
	}
	if rest != nil {
		return fmt.Errorf("%w: %q: more than 4 fields", ErrMalformed, clip(b))
	}
	if ev.Size > MaxSize && a != OOM {
		return fmt.Errorf("%w: %s size %d exceeds %d", ErrBadSize, a, ev.Size, uint64(MaxSize))
	}
	return nil
}

// csvUint parses the decimal field at the start of b, up to the next comma.
// rest is what follows the comma, nil if the line ended.
func csvUint(b []byte, field string, line []byte) (v uint64, rest []byte, err error) {
	i := 0
	for ; i < len(b); i++ {
		c := b[i] - '0'
		if c > 9 {
			break
		}
		if v > (1<<64-1-uint64(c))/10 {
			return 0, nil, fmt.Errorf("%w: %q: %s overflows 64 bits", ErrMalformed, clip(line), field)
		}
		v = v*10 + uint64(c)
	}
	switch {
	case i == len(b) && i > 0:
		return v, nil, nil
	case i > 0 && b[i] == ',':
		return v, b[i+1:], nil
	case i == 0 && len(b) > 0 && b[0] == '-' && field == "size":
		return 0, nil, fmt.Errorf("%w: %q: negative size", ErrBadSize, clip(line))
	case i == 0 && len(b) == 0:
		return 0, nil, fmt.Errorf("%w: %q: missing %s (want 4 fields %s)", ErrMalformed, clip(line), field, csvHeader)
	}
	return 0, nil, fmt.Errorf("%w: %q: %s is not a decimal number", ErrMalformed, clip(line), field)
}

// clip shortens b for an error message.
func clip(b []byte) []byte {
	if len(b) > 64 {
		return append(b[:60:60], "..."...)
	}
	return b
}
