package kvcache

import (
	"encoding/json"
	"io"
	"strconv"
	"sync"
)

// EventKind says what happened to the prefix cache.
type EventKind uint8

// KV events, the stream a cache-aware router follows (as vLLM publishes
// them): a full block stored in the prefix cache, a block removed from it
// (evicted for reuse), the whole cache cleared.
const (
	BlockStored EventKind = iota + 1
	BlockRemoved
	AllCleared
)

func (k EventKind) String() string {
	switch k {
	case BlockStored:
		return "stored"
	case BlockRemoved:
		return "removed"
	case AllCleared:
		return "all_cleared"
	}
	return "kind" + strconv.Itoa(int(k))
}

// Event is one KV event. For AllCleared only Kind is set (Block is NoBlock).
type Event struct {
	Kind EventKind
	// Hash is the block's chained hash, Parent its parent block's (the
	// root hash of the extra key for a first block).
	Hash, Parent uint64
	// Block is the device block id; Tokens the tokens it holds.
	Block  int32
	Tokens int
}

type eventJSON struct {
	Event  string  `json:"event"`
	Hash   *string `json:"block_hash,omitempty"`
	Parent *string `json:"parent_hash,omitempty"`
	Block  *int32  `json:"block,omitempty"`
	Tokens int     `json:"tokens,omitempty"`
}

// MarshalJSON writes {"event":"stored","block_hash":"…","parent_hash":"…",
// "block":3,"tokens":16}; hashes are 16 hex digits (a JSON number cannot hold
// 64 bits exactly).
func (e Event) MarshalJSON() ([]byte, error) {
	j := eventJSON{Event: e.Kind.String()}
	if e.Kind != AllCleared {
		h, p := hex64(e.Hash), hex64(e.Parent)
		b := e.Block
		j.Hash, j.Parent, j.Block, j.Tokens = &h, &p, &b, e.Tokens
	}
	return json.Marshal(j)
}

func hex64(v uint64) string {
	s := strconv.FormatUint(v, 16)
	for len(s) < 16 {
		s = "0" + s
	}
	return s
}

// EventWriter returns an OnEvent callback that writes each event to w as
// one JSON line, and a function returning the first write error. It is
// safe for concurrent use.
func EventWriter(w io.Writer) (onEvent func(Event), err func() error) {
	var mu sync.Mutex
	var first error
	onEvent = func(e Event) {
		b, _ := e.MarshalJSON()
		b = append(b, '\n')
		mu.Lock()
		defer mu.Unlock()
		if first == nil {
			_, first = w.Write(b)
		}
	}
	return onEvent, func() error { mu.Lock(); defer mu.Unlock(); return first }
}
