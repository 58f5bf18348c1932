package trace

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"io"
)

// A PyTorch memory snapshot is a pickled dict (see the package doc):
// {"segments": [...], "device_traces": [[entry, ...], ...],
// "allocator_settings": {...}, ...}, each entry a dict with "action",
// "addr", "size", "stream", "time_us", "frames" and, for OOM,
// "device_free" in place of "addr".
//
// pickleDecoder is a restricted unpickler: it runs only the opcodes a
// snapshot uses (protocols 2 to 5), refuses every opcode that imports or
// calls code, and never builds the whole tree. Containers get a role from
// where they are created (the snapshot schema: root dict → "segments" list
// → segment dicts; root → "device_traces" list → one list per device →
// entry dicts); only those keep state, and only the fields memwall needs.
// Everything else (frames, blocks, allocator settings) is parsed and
// dropped. Entries are emitted as the pickle appends them to their device
// list, so the snapshot streams: memory holds the pickle stack (one batch
// of at most 1000 entries in Python's pickler), the memo (one small value
// per memoized object: Python memoizes every dict, list and string), and
// nothing per emitted event.

const pickleProto = 0x80

// Pickle opcodes this decoder runs.
const (
	opMark            = '('
	opStop            = '.'
	opBinInt          = 'J'
	opBinInt1         = 'K'
	opBinInt2         = 'M'
	opLong1           = 0x8a
	opLong4           = 0x8b
	opNone            = 'N'
	opNewTrue         = 0x88
	opNewFalse        = 0x89
	opBinFloat        = 'G'
	opBinUnicode      = 'X'
	opShortBinUnicode = 0x8c
	opBinUnicode8     = 0x8d
	opBinBytes        = 'B'
	opShortBinBytes   = 'C'
	opBinBytes8       = 0x8e
	opEmptyList       = ']'
	opAppend          = 'a'
	opAppends         = 'e'
	opEmptyDict       = '}'
	opSetItem         = 's'
	opSetItems        = 'u'
	opEmptyTuple      = ')'
	opTuple           = 't'
	opTuple1          = 0x85
	opTuple2          = 0x86
	opTuple3          = 0x87
	opBinGet          = 'h'
	opLongBinGet      = 'j'
	opBinPut          = 'q'
	opLongBinPut      = 'r'
	opMemoize         = 0x94
	opProto           = pickleProto
	opFrame           = 0x95
)

// opNames names every opcode of pickle protocols 0 to 5, for errors.
var opNames = [256]string{
	'(': "MARK", '.': "STOP", '0': "POP", '1': "POP_MARK", '2': "DUP",
	'F': "FLOAT", 'I': "INT", 'J': "BININT", 'K': "BININT1", 'L': "LONG",
	'M': "BININT2", 'N': "NONE", 'P': "PERSID", 'Q': "BINPERSID", 'R': "REDUCE",
	'S': "STRING", 'T': "BINSTRING", 'U': "SHORT_BINSTRING", 'V': "UNICODE",
	'X': "BINUNICODE", 'a': "APPEND", 'b': "BUILD", 'c': "GLOBAL", 'd': "DICT",
	'}': "EMPTY_DICT", 'e': "APPENDS", 'g': "GET", 'h': "BINGET", 'i': "INST",
	'j': "LONG_BINGET", 'l': "LIST", ']': "EMPTY_LIST", 'o': "OBJ", 'p': "PUT",
	'q': "BINPUT", 'r': "LONG_BINPUT", 's': "SETITEM", 't': "TUPLE",
	')': "EMPTY_TUPLE", 'u': "SETITEMS", 'G': "BINFLOAT",
	0x80: "PROTO", 0x81: "NEWOBJ", 0x82: "EXT1", 0x83: "EXT2", 0x84: "EXT4",
	0x85: "TUPLE1", 0x86: "TUPLE2", 0x87: "TUPLE3", 0x88: "NEWTRUE",
	0x89: "NEWFALSE", 0x8a: "LONG1", 0x8b: "LONG4",
	'B': "BINBYTES", 'C': "SHORT_BINBYTES",
	0x8c: "SHORT_BINUNICODE", 0x8d: "BINUNICODE8", 0x8e: "BINBYTES8",
	0x8f: "EMPTY_SET", 0x90: "ADDITEMS", 0x91: "FROZENSET", 0x92: "NEWOBJ_EX",
	0x93: "STACK_GLOBAL", 0x94: "MEMOIZE", 0x95: "FRAME",
	0x96: "BYTEARRAY8", 0x97: "NEXT_BUFFER", 0x98: "READONLY_BUFFER",
}

// forbidden reports whether op imports or calls code (or reaches outside
// the pickle for objects): the opcodes a hostile pickle needs.
func forbidden(op byte) bool {
	switch op {
	case 'c', 0x93, 'R', 'b', 'i', 'o', 0x81, 0x92, 'P', 'Q', 0x82, 0x83, 0x84:
		return true
	}
	return false
}

// Limits of the decoder besides Options.MaxObjects.
const (
	maxPickleDepth = 64      // MARKs open at once (a snapshot nests about 7)
	maxShortString = 40      // strings kept for error messages, in bytes
	maxStrings     = 1 << 16 // distinct short strings kept
	maxLong        = 1 << 20 // LONG4 length in bytes
)

type vkind uint8

const (
	kNone vkind = iota
	kBool
	kInt  // n is the value
	kUint // n holds a uint64 ≥ 2^63
	kBig  // an integer beyond 64 bits (not kept)
	kFloat
	kStr // atom names a known string; n indexes strs, or is -1
	kBytes
	kTuple
	kList // slot and n (generation) name the state of a significant list
	kDict
)

var kindNames = [...]string{"None", "bool", "int", "int", "int", "float", "str", "bytes", "tuple", "list", "dict"}

func (k vkind) String() string { return kindNames[k] }

// value is one pickle stack or memo item: 16 bytes, no pointers.
type value struct {
	kind vkind
	role role
	atom atom
	slot uint32
	n    int64
}

// pending is an event (or a record error) ready for next.
type pending struct {
	ev  Event
	pos Pos
	err error
}

type pickleDecoder struct {
	in         input
	opOff      int64 // offset of the opcode being run
	maxObjects int

	stack  []value
	marks  []int
	memo   []value
	sparse map[uint64]value // memo entries put out of order
	slots  []slot
	free   []uint32 // recycled slot indexes
	strs   []string // short strings, for error messages
	strIdx map[string]int64

	queue    []pending
	head     int
	last     Pos  // position of what next returned last
	stopped  bool // STOP run
	fatal    error
	rootSeen bool
	tracesOK bool // a device_traces list was seen

	hasSegments               bool
	segments, devices         int
	segReserved, segAllocated uint64
}

func newPickleDecoder(br *bufio.Reader, maxObjects int) *pickleDecoder {
	return &pickleDecoder{
		in:         input{src: br, buf: make([]byte, 64<<10)},
		maxObjects: maxObjects,
		strIdx:     make(map[string]int64),
	}
}

func (d *pickleDecoder) pos() Pos        { return d.last }
func (d *pickleDecoder) consumed() int64 { return d.in.offset() }

func (d *pickleDecoder) fillMeta(m *Meta) {
	m.HasSegments = d.hasSegments
	m.Segments = d.segments
	m.SegmentsReserved = d.segReserved
	m.SegmentsAllocated = d.segAllocated
	m.Devices = d.devices
}

// prime runs the pickle up to its first event, so that Meta's snapshot
// figures are known; an error is kept for next.
func (d *pickleDecoder) prime() {
	for d.head == len(d.queue) && !d.stopped && d.fatal == nil {
		if err := d.step(); err != nil {
			d.fatal = err
		}
	}
}

func (d *pickleDecoder) next(ev *Event) error {
	for d.head == len(d.queue) {
		if d.fatal != nil {
			d.last = Pos{Offset: d.opOff}
			return d.fatal
		}
		if d.stopped {
			return io.EOF
		}
		d.queue, d.head = d.queue[:0], 0
		if err := d.step(); err != nil {
			d.fatal = err
		}
	}
	p := &d.queue[d.head]
	d.head++
	d.last = p.pos
	if p.err != nil {
		return p.err
	}
	*ev = p.ev
	return nil
}

// input is a byte source with its own buffer: the decoder's hot path reads
// opcodes and their few argument bytes straight from a slice.
type input struct {
	src   io.Reader
	buf   []byte
	r, w  int
	base  int64 // offset of buf[0]
	err   error // sticky error from src
	stall int   // consecutive empty reads
}

func (in *input) offset() int64 { return in.base + int64(in.r) }

// fill makes at least n ≤ len(in.buf) bytes available; false if the input
// ends first (in.err says why).
func (in *input) fill(n int) bool {
	for in.w-in.r < n {
		if in.err != nil {
			return false
		}
		if in.r > 0 {
			copy(in.buf, in.buf[in.r:in.w])
			in.base += int64(in.r)
			in.w -= in.r
			in.r = 0
		}
		m, err := in.src.Read(in.buf[in.w:])
		in.w += m
		switch {
		case err != nil:
			in.err = err
		case m == 0:
			if in.stall++; in.stall > 100 {
				in.err = io.ErrNoProgress
			}
		default:
			in.stall = 0
		}
	}
	return true
}

// truncated turns the input's error into ErrTruncated naming what was
// being read, or wraps a read error (a cut gzip stream is already
// ErrTruncated).
func (d *pickleDecoder) truncated(what string) error {
	if d.in.err == io.EOF {
		return fmt.Errorf("%w: data ends inside %s", ErrTruncated, what)
	}
	return fmt.Errorf("reading %s: %w", what, d.in.err)
}

// read returns the next n ≤ 256 bytes, valid until the next read.
func (d *pickleDecoder) read(n int, what string) ([]byte, error) {
	in := &d.in
	if in.w-in.r < n && !in.fill(n) {
		in.r = in.w
		return nil, d.truncated(what)
	}
	b := in.buf[in.r : in.r+n]
	in.r += n
	return b, nil
}

func (d *pickleDecoder) uint(n int, what string) (uint64, error) {
	b, err := d.read(n, what)
	if err != nil {
		return 0, err
	}
	var v uint64
	for i := n - 1; i >= 0; i-- {
		v = v<<8 | uint64(b[i])
	}
	return v, nil
}

// discard skips n bytes without keeping them.
func (d *pickleDecoder) discard(n uint64, what string) error {
	in := &d.in
	for n > 0 {
		if in.r == in.w && !in.fill(1) {
			return d.truncated(what)
		}
		k := min(n, uint64(in.w-in.r))
		in.r += int(k)
		n -= k
	}
	return nil
}

func (d *pickleDecoder) corrupt(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrCorrupt, fmt.Sprintf(format, args...))
}

func (d *pickleDecoder) push(v value) error {
	if len(d.stack)+len(d.memo)+len(d.sparse) >= d.maxObjects {
		return fmt.Errorf("%w: more than %d pickle objects (Options.MaxObjects)", ErrLimit, d.maxObjects)
	}
	d.stack = append(d.stack, v)
	return nil
}

// popMark pops the topmost mark and returns the items above it and the
// mark's position. With container set, the item below the mark must be
// above the next mark (it is the container the items go into).
func (d *pickleDecoder) popMark(op string, container bool) ([]value, int, error) {
	if len(d.marks) == 0 {
		return nil, 0, d.corrupt("%s without MARK", op)
	}
	m := d.marks[len(d.marks)-1]
	d.marks = d.marks[:len(d.marks)-1]
	if container {
		floor := 0
		if len(d.marks) > 0 {
			floor = d.marks[len(d.marks)-1]
		}
		if m-1 < floor {
			return nil, 0, d.corrupt("%s with nothing below its MARK", op)
		}
	}
	return d.stack[m:], m, nil
}

// top returns the topmost item above the last mark.
func (d *pickleDecoder) top(n int, op string) ([]value, error) {
	floor := 0
	if len(d.marks) > 0 {
		floor = d.marks[len(d.marks)-1]
	}
	if len(d.stack)-floor < n {
		return nil, d.corrupt("%s needs %d stack items", op, n)
	}
	return d.stack[len(d.stack)-n:], nil
}

// step runs one opcode.
func (d *pickleDecoder) step() error {
	in := &d.in
	if in.r == in.w && !in.fill(1) {
		d.opOff = in.offset()
		return d.truncated("the pickle (no STOP opcode)")
	}
	d.opOff = in.offset()
	op := in.buf[in.r]
	in.r++
	name := opNames[op]
	if forbidden(op) {
		return fmt.Errorf("%w: %s (0x%02x): a snapshot never imports or calls code", ErrForbidden, name, op)
	}
	switch op {
	case opProto:
		b, err := d.read(1, "PROTO")
		if err != nil {
			return err
		}
		if b[0] < 2 || b[0] > 5 {
			return d.corrupt("pickle protocol %d, want 2 to 5", b[0])
		}
	case opFrame:
		if _, err := d.read(8, "FRAME"); err != nil {
			return err
		}
	case opMark:
		if len(d.marks) >= maxPickleDepth {
			return fmt.Errorf("%w: more than %d nested MARKs", ErrLimit, maxPickleDepth)
		}
		d.marks = append(d.marks, len(d.stack))
	case opStop:
		return d.stop()
	case opNone:
		return d.push(value{kind: kNone})
	case opNewTrue, opNewFalse:
		return d.push(value{kind: kBool, n: int64(op - opNewFalse)})
	case opBinInt:
		v, err := d.uint(4, name)
		if err != nil {
			return err
		}
		return d.push(value{kind: kInt, n: int64(int32(uint32(v)))})
	case opBinInt1, opBinInt2:
		n := 1
		if op == opBinInt2 {
			n = 2
		}
		v, err := d.uint(n, name)
		if err != nil {
			return err
		}
		return d.push(value{kind: kInt, n: int64(v)})
	case opLong1, opLong4:
		return d.long(op, name)
	case opBinFloat:
		v, err := d.read(8, name)
		if err != nil {
			return err
		}
		return d.push(value{kind: kFloat, n: int64(binary.BigEndian.Uint64(v))})
	case opShortBinUnicode, opBinUnicode, opBinUnicode8, opShortBinBytes, opBinBytes, opBinBytes8:
		return d.str(op, name)
	case opEmptyList:
		return d.push(d.container(kList))
	case opEmptyDict:
		return d.push(d.container(kDict))
	case opEmptyTuple:
		return d.push(value{kind: kTuple})
	case opTuple1, opTuple2, opTuple3:
		items, err := d.top(int(op-opTuple1)+1, name)
		if err != nil {
			return err
		}
		d.release(items...)
		d.stack = d.stack[:len(d.stack)-len(items)]
		return d.push(value{kind: kTuple})
	case opTuple:
		items, m, err := d.popMark(name, false)
		if err != nil {
			return err
		}
		d.release(items...)
		d.stack = d.stack[:m]
		return d.push(value{kind: kTuple})
	case opAppend:
		items, err := d.top(2, name)
		if err != nil {
			return err
		}
		if err := d.appendItems(items[0], items[1:]); err != nil {
			return err
		}
		d.stack = d.stack[:len(d.stack)-1]
	case opAppends:
		items, m, err := d.popMark(name, true)
		if err != nil {
			return err
		}
		if err := d.appendItems(d.stack[m-1], items); err != nil {
			return err
		}
		d.stack = d.stack[:m]
	case opSetItem:
		items, err := d.top(3, name)
		if err != nil {
			return err
		}
		if err := d.setItems(items[0], items[1:]); err != nil {
			return err
		}
		d.stack = d.stack[:len(d.stack)-2]
	case opSetItems:
		items, m, err := d.popMark(name, true)
		if err != nil {
			return err
		}
		if err := d.setItems(d.stack[m-1], items); err != nil {
			return err
		}
		d.stack = d.stack[:m]
	case opMemoize:
		return d.put(uint64(len(d.memo)+len(d.sparse)), name)
	case opBinPut, opLongBinPut:
		n := 1
		if op == opLongBinPut {
			n = 4
		}
		k, err := d.uint(n, name)
		if err != nil {
			return err
		}
		return d.put(k, name)
	case opBinGet, opLongBinGet:
		n := 1
		if op == opLongBinGet {
			n = 4
		}
		k, err := d.uint(n, name)
		if err != nil {
			return err
		}
		v, ok := d.get(k)
		if !ok {
			return d.corrupt("%s of memo entry %d, which was never put", name, k)
		}
		return d.push(v)
	default:
		if name == "" {
			return d.corrupt("byte 0x%02x is not a pickle opcode", op)
		}
		return d.corrupt("opcode %s (0x%02x) is not used by snapshots", name, op)
	}
	return nil
}

// long decodes LONG1 and LONG4: a little-endian two's-complement integer.
func (d *pickleDecoder) long(op byte, name string) error {
	n := uint64(0)
	var err error
	if op == opLong1 {
		n, err = d.uint(1, name)
	} else {
		n, err = d.uint(4, name)
		if err == nil && n > maxLong {
			err = fmt.Errorf("%w: %s of %d bytes (at most %d)", ErrLimit, name, n, maxLong)
		}
	}
	if err != nil {
		return err
	}
	if n > 256 {
		if err := d.discard(n, name); err != nil {
			return err
		}
		return d.push(value{kind: kBig})
	}
	b, err := d.read(int(n), name)
	if err != nil {
		return err
	}
	return d.push(decodeLong(b))
}

// decodeLong decodes a two's-complement little-endian integer.
func decodeLong(b []byte) value {
	if len(b) == 0 {
		return value{kind: kInt}
	}
	neg := b[len(b)-1]&0x80 != 0
	// Drop redundant sign bytes.
	for len(b) > 1 {
		last, prev := b[len(b)-1], b[len(b)-2]
		if (last == 0 && prev&0x80 == 0) || (last == 0xff && prev&0x80 != 0) {
			b = b[:len(b)-1]
			continue
		}
		break
	}
	if len(b) > 9 || (len(b) == 9 && (neg || b[8] != 0)) {
		return value{kind: kBig}
	}
	var u uint64
	for i := min(len(b), 8) - 1; i >= 0; i-- {
		u = u<<8 | uint64(b[i])
	}
	if len(b) == 9 {
		return value{kind: kUint, n: int64(u)} // 2^63 ≤ u < 2^64
	}
	if neg && len(b) < 8 {
		u |= ^uint64(0) << (8 * len(b))
	}
	return value{kind: kInt, n: int64(u)}
}

// str decodes the string and bytes opcodes. Only short strings are kept:
// known keys and action names as atoms, others for error messages.
func (d *pickleDecoder) str(op byte, name string) error {
	var n uint64
	var err error
	switch op {
	case opShortBinUnicode, opShortBinBytes:
		n, err = d.uint(1, name)
	case opBinUnicode, opBinBytes:
		n, err = d.uint(4, name)
	default:
		n, err = d.uint(8, name)
	}
	if err != nil {
		return err
	}
	isStr := op == opShortBinUnicode || op == opBinUnicode || op == opBinUnicode8
	if !isStr || n > maxShortString {
		if err := d.discard(n, name); err != nil {
			return err
		}
		if !isStr {
			return d.push(value{kind: kBytes})
		}
		return d.push(value{kind: kStr, n: -1})
	}
	b, err := d.read(int(n), name)
	if err != nil {
		return err
	}
	v := value{kind: kStr, atom: atomOf(b), n: -1}
	if v.atom == atomNone {
		if i, ok := d.strIdx[string(b)]; ok {
			v.n = i
		} else if len(d.strs) < maxStrings {
			v.n = int64(len(d.strs))
			s := string(b)
			d.strs = append(d.strs, s)
			d.strIdx[s] = v.n
		}
	}
	return d.push(v)
}

// put memoizes the top of the stack under key k.
func (d *pickleDecoder) put(k uint64, name string) error {
	items, err := d.top(1, name)
	if err != nil {
		return err
	}
	v := items[0]
	switch {
	case k < uint64(len(d.memo)):
		d.memo[k] = v
		return nil
	case len(d.stack)+len(d.memo)+len(d.sparse) >= d.maxObjects:
		return fmt.Errorf("%w: more than %d pickle objects (Options.MaxObjects)", ErrLimit, d.maxObjects)
	case k == uint64(len(d.memo)):
		d.memo = append(d.memo, v)
		// Entries put ahead of time now continue the dense memo.
		for len(d.sparse) > 0 {
			next := uint64(len(d.memo))
			sv, ok := d.sparse[next]
			if !ok {
				break
			}
			d.memo = append(d.memo, sv)
			delete(d.sparse, next)
		}
		delete(d.sparse, k)
	default:
		if d.sparse == nil {
			d.sparse = make(map[uint64]value)
		}
		d.sparse[k] = v
	}
	return nil
}

func (d *pickleDecoder) get(k uint64) (value, bool) {
	if k < uint64(len(d.memo)) {
		return d.memo[k], true
	}
	v, ok := d.sparse[k]
	return v, ok
}
