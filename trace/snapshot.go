package trace

import (
	"fmt"
	"math"
)

// This file maps the pickle onto the snapshot schema: which containers
// matter (roles), the few fields kept from them, and the events they yield.

// role is a container's place in the snapshot schema.
type role uint8

const (
	roleOther    role = iota // anything memwall does not read
	roleRoot                 // the snapshot dict
	roleSegments             // root["segments"]
	roleSegment              // one of its dicts
	roleTraces               // root["device_traces"]
	roleDevice               // one device's list of entries
	roleEntry                // one TraceEntry dict
)

// atom is a known string: a key or an action name.
type atom uint8

const (
	atomNone atom = iota
	atomAction
	atomAddr
	atomSize
	atomStream
	atomTimeUS
	atomDeviceFree
	atomSegments
	atomDeviceTraces
	atomTotalSize
	atomAllocatedSize
	atomIgnoredAction
	atomFirstAction // atomFirstAction + Action(a) names action a
)

var atomNames = [...]string{"", "action", "addr", "size", "stream", "time_us", "device_free",
	"segments", "device_traces", "total_size", "allocated_size"}

func atomOf(b []byte) atom {
	switch string(b) {
	case "action":
		return atomAction
	case "addr":
		return atomAddr
	case "size":
		return atomSize
	case "stream":
		return atomStream
	case "time_us":
		return atomTimeUS
	case "device_free":
		return atomDeviceFree
	case "segments":
		return atomSegments
	case "device_traces":
		return atomDeviceTraces
	case "total_size":
		return atomTotalSize
	case "allocated_size":
		return atomAllocatedSize
	}
	if a, ok, ignored := parseActionBytes(b); ok {
		return atomFirstAction + atom(a)
	} else if ignored {
		return atomIgnoredAction
	}
	return atomNone
}

// slot is the state of one significant container.
type slot struct {
	gen   int64
	role  role
	start int64 // offset of the opcode that created it
	index int64 // device list: device index; entry: index in its list
	items int64 // lists: items appended so far

	// Entry and segment fields.
	set     uint8 // fields present, by bit
	action  atom
	strName int64 // entry: strs index of an unknown action name, or -1
	addr    uint64
	size    uint64
	stream  uint64
	timeUS  int64
	free    uint64 // device_free, or a segment's allocated_size
	bad     error  // the first problem with an entry's fields
}

const (
	setAction = 1 << iota
	setAddr
	setSize
	setFree
)

// container creates an empty list or dict, with a slot when its role in
// the schema matters.
func (d *pickleDecoder) container(kind vkind) value {
	v := value{kind: kind}
	r := d.childRole(kind)
	if r == roleOther {
		return v
	}
	var id uint32
	if n := len(d.free); n > 0 {
		id = d.free[n-1]
		d.free = d.free[:n-1]
	} else {
		d.slots = append(d.slots, slot{})
		id = uint32(len(d.slots) - 1)
	}
	s := &d.slots[id]
	*s = slot{gen: s.gen, role: r, start: d.opOff, strName: -1}
	switch r {
	case roleSegments:
		d.hasSegments = true
	case roleTraces:
		d.tracesOK = true
	case roleDevice:
		s.index = int64(d.devices)
		d.devices++
	}
	v.role, v.slot, v.n = r, id, s.gen
	return v
}

// childRole decides the role of a container about to be pushed. The
// container will end up in one of three places: the list just below it
// (APPEND), the dict two below it under the key just below it (SETITEM),
// or the container below the topmost MARK (APPENDS, SETITEMS). Python's
// pickler makes the three ambiguous only when a list is still empty; the
// schema settles it (a device list holds dicts, device_traces holds lists),
// so the first place that gives a schema role wins.
func (d *pickleDecoder) childRole(kind vkind) role {
	p := len(d.stack)
	m, marked := 0, len(d.marks) > 0
	if marked {
		m = d.marks[len(d.marks)-1]
	}
	if p == 0 && !marked && !d.rootSeen {
		d.rootSeen = true
		if kind == kDict {
			return roleRoot
		}
		return roleOther
	}
	if p-1 >= m && p >= 1 && d.stack[p-1].kind == kList {
		if r := d.schemaChild(d.stack[p-1], atomNone, kind); r != roleOther {
			return r
		}
	}
	if p-2 >= m && p >= 2 && d.stack[p-2].kind == kDict && !d.stack[p-1].isContainer() {
		if r := d.schemaChild(d.stack[p-2], d.stack[p-1].atom, kind); r != roleOther {
			return r
		}
	}
	if marked && m >= 1 {
		switch parent := d.stack[m-1]; parent.kind {
		case kList:
			return d.schemaChild(parent, atomNone, kind)
		case kDict:
			if (p-m)%2 == 1 {
				return d.schemaChild(parent, d.stack[p-1].atom, kind)
			}
		}
	}
	return roleOther
}

func (v value) isContainer() bool { return v.kind == kList || v.kind == kDict }

// schemaChild is the role of a kind container placed in parent (under key,
// for a dict).
func (d *pickleDecoder) schemaChild(parent value, key atom, kind vkind) role {
	if d.slotOf(parent) == nil {
		return roleOther
	}
	switch parent.role {
	case roleRoot:
		if kind == kList && key == atomSegments {
			return roleSegments
		}
		if kind == kList && key == atomDeviceTraces {
			return roleTraces
		}
	case roleSegments:
		if kind == kDict {
			return roleSegment
		}
	case roleTraces:
		if kind == kList {
			return roleDevice
		}
	case roleDevice:
		if kind == kDict {
			return roleEntry
		}
	}
	return roleOther
}

// slotOf returns v's slot, or nil if v has none or the slot was recycled
// (a memo reference to a container already consumed).
func (d *pickleDecoder) slotOf(v value) *slot {
	if v.role == roleOther || !v.isContainer() {
		return nil
	}
	s := &d.slots[v.slot]
	if s.gen != v.n {
		return nil
	}
	return s
}

// release recycles the slots of values leaving the stack.
func (d *pickleDecoder) release(vs ...value) {
	for _, v := range vs {
		if s := d.slotOf(v); s != nil {
			s.gen++
			d.free = append(d.free, v.slot)
		}
	}
}

// appendItems runs APPEND/APPENDS of items to list, emitting the entries
// of device lists.
func (d *pickleDecoder) appendItems(list value, items []value) error {
	if list.kind != kList {
		return d.corrupt("APPEND to a %s", list.kind)
	}
	ls := d.slotOf(list)
	for _, it := range items {
		if ls != nil {
			switch list.role {
			case roleDevice:
				d.emit(ls, it)
			case roleSegments:
				if s := d.slotOf(it); s != nil && it.role == roleSegment {
					d.segments++
					d.segReserved += s.size
					d.segAllocated += s.free
				}
			}
			ls.items++
		}
		d.release(it)
	}
	return nil
}

// emit queues the event (or record error) of entry it, item number
// dev.items of device list dev.
func (d *pickleDecoder) emit(dev *slot, it value) {
	s := d.slotOf(it)
	p := pending{pos: Pos{Offset: d.opOff, Device: int(dev.index), Entry: dev.items + 1}}
	switch {
	case it.kind != kDict:
		p.err = fmt.Errorf("%w: trace entry is a %s, want a dict", ErrMalformed, it.kind)
	case s == nil && it.role == roleEntry:
		p.err = fmt.Errorf("%w: trace entry is a memo reference to an entry already read", ErrMalformed)
	case s == nil || it.role != roleEntry:
		p.err = fmt.Errorf("%w: trace entry is a dict made elsewhere in the pickle", ErrMalformed)
	default:
		p.pos.Offset = s.start
		p.err = d.entryEvent(s, dev, &p.ev)
	}
	d.queue = append(d.queue, p)
}

// entryEvent builds the event of entry s.
func (d *pickleDecoder) entryEvent(s *slot, dev *slot, ev *Event) error {
	if s.bad != nil {
		return s.bad
	}
	if s.set&setAction == 0 {
		return fmt.Errorf("%w: entry has no \"action\"", ErrMalformed)
	}
	switch {
	case s.action == atomIgnoredAction:
		return errIgnored
	case s.action < atomFirstAction || s.action >= atomFirstAction+atom(numActions) || s.action == atomFirstAction:
		if s.strName >= 0 {
			return fmt.Errorf("%w: %q", ErrUnknownAction, d.strs[s.strName])
		}
		if s.action != atomNone {
			return fmt.Errorf("%w: %q", ErrUnknownAction, atomNames[s.action])
		}
		return fmt.Errorf("%w: not one of PyTorch's action names", ErrUnknownAction)
	}
	ev.Action = Action(s.action - atomFirstAction)
	if s.set&setSize == 0 {
		return fmt.Errorf("%w: %s entry has no \"size\"", ErrMalformed, ev.Action)
	}
	if ev.Action == OOM {
		ev.DeviceFree = s.free
	} else if s.set&setAddr == 0 {
		return fmt.Errorf("%w: %s entry has no \"addr\"", ErrMalformed, ev.Action)
	}
	if ev.Size = s.size; ev.Size > MaxSize && ev.Action != OOM {
		return fmt.Errorf("%w: %s size %d exceeds %d", ErrBadSize, ev.Action, ev.Size, uint64(MaxSize))
	}
	ev.Addr, ev.Stream, ev.Device = s.addr, s.stream, int(dev.index)
	if s.timeUS > math.MaxInt64/1000 || s.timeUS < math.MinInt64/1000 {
		return fmt.Errorf("%w: time_us %d out of range", ErrMalformed, s.timeUS)
	}
	ev.Time = s.timeUS * 1000
	return nil
}

// setItems runs SETITEM/SETITEMS of key/value pairs kv into dict.
func (d *pickleDecoder) setItems(dict value, kv []value) error {
	if dict.kind != kDict {
		return d.corrupt("SETITEM into a %s", dict.kind)
	}
	if len(kv)%2 != 0 {
		return d.corrupt("SETITEMS with an odd number of items (%d)", len(kv))
	}
	s := d.slotOf(dict)
	for i := 0; i < len(kv); i += 2 {
		k, v := kv[i], kv[i+1]
		if k.isContainer() {
			return d.corrupt("dict key is a %s (unhashable)", k.kind)
		}
		if s != nil {
			switch dict.role {
			case roleEntry:
				d.entryField(s, k, v)
			case roleSegment:
				switch k.atom {
				case atomTotalSize:
					s.size, _ = nonNegative(v)
				case atomAllocatedSize:
					s.free, _ = nonNegative(v)
				}
			}
		}
		d.release(k, v)
	}
	return nil
}

// nonNegative returns v as a uint64 if it is a non-negative integer.
func nonNegative(v value) (uint64, bool) {
	switch {
	case v.kind == kUint, v.kind == kInt && v.n >= 0:
		return uint64(v.n), true
	}
	return 0, false
}

// entryField records key k = v of a trace entry. A wrong type becomes the
// entry's error, reported when the entry is emitted.
func (d *pickleDecoder) entryField(s *slot, k, v value) {
	if k.kind != kStr {
		return
	}
	fail := func(format string, args ...any) {
		if s.bad == nil {
			s.bad = fmt.Errorf(format, args...)
		}
	}
	var field string
	switch k.atom {
	case atomAction:
		if v.kind != kStr {
			fail("%w: \"action\" is a %s, want a str", ErrMalformed, v.kind)
			return
		}
		s.set |= setAction
		s.action, s.strName = v.atom, v.n
		return
	case atomAddr:
		field = "addr"
	case atomSize:
		field = "size"
	case atomStream:
		// The stream is an opaque handle: keep its bits even if negative.
		switch v.kind {
		case kInt, kUint:
			s.stream = uint64(v.n)
		case kBig:
			fail("%w: stream does not fit in 64 bits", ErrMalformed)
		default:
			fail("%w: \"stream\" is a %s, want an int", ErrMalformed, v.kind)
		}
		return
	case atomTimeUS:
		switch v.kind {
		case kInt:
			s.timeUS = v.n
		case kUint, kBig:
			fail("%w: time_us out of range", ErrMalformed)
		default:
			fail("%w: \"time_us\" is a %s, want an int", ErrMalformed, v.kind)
		}
		return
	case atomDeviceFree:
		field = "device_free"
	default:
		return
	}
	u, ok := nonNegative(v)
	switch {
	case ok:
	case v.kind == kInt && field == "size":
		fail("%w: negative size %d", ErrBadSize, v.n)
		return
	case v.kind == kInt:
		fail("%w: negative %s %d", ErrMalformed, field, v.n)
		return
	case v.kind == kBig:
		fail("%w: %s does not fit in 64 bits", ErrMalformed, field)
		return
	default:
		fail("%w: %q is a %s, want an int", ErrMalformed, field, v.kind)
		return
	}
	switch k.atom {
	case atomAddr:
		s.addr = u
		s.set |= setAddr
	case atomSize:
		s.size = u
		s.set |= setSize
	case atomDeviceFree:
		s.free = u
		s.set |= setFree
	}
}

// stop runs STOP: the stack must hold the snapshot dict alone.
func (d *pickleDecoder) stop() error {
	if len(d.stack) != 1 || len(d.marks) != 0 {
		return d.corrupt("STOP with %d stack items and %d open MARKs, want the snapshot dict alone", len(d.stack), len(d.marks))
	}
	root := d.stack[0]
	if root.kind != kDict || root.role != roleRoot {
		return fmt.Errorf("%w: the pickle holds a %s, not a snapshot dict", ErrFormat, root.kind)
	}
	if !d.tracesOK {
		return fmt.Errorf("%w: the snapshot dict has no \"device_traces\" list (not a memory snapshot?)", ErrFormat)
	}
	d.release(root)
	d.stack = d.stack[:0]
	d.stopped = true
	return nil
}
