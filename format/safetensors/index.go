package safetensors

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"

	"github.com/memwall/memwall/format"
	"github.com/memwall/memwall/format/mmap"
)

// Index is a parsed model.safetensors.index.json.
type Index struct {
	// Metadata is the index's "metadata" object; JSON numbers that are
	// integers become uint64 or int64, others float64.
	Metadata map[string]any
	// WeightMap maps each tensor name to its shard file, relative to the
	// index's directory.
	WeightMap map[string]string
}

// ParseIndex parses the contents of a sharded-checkpoint index. name is used
// in errors. Shard names must be local paths (no "..", not absolute).
func ParseIndex(name string, b []byte) (*Index, error) {
	corrupt := func(tensor, field, f string, a ...any) error {
		return &format.Error{Format: FormatName, File: name, Tensor: tensor, Field: field,
			Reason: fmt.Sprintf(f, a...), Kind: format.ErrCorrupt}
	}
	if len(b) > MaxHeaderBytes {
		return nil, corrupt("", "", "index is %d bytes, over the %d-byte limit", len(b), MaxHeaderBytes)
	}
	ix := &Index{Metadata: map[string]any{}}
	haveMap := false
	err := walkObject(b, func(key string, dec *json.Decoder) error {
		switch key {
		case "metadata":
			dec.UseNumber()
			var m map[string]any
			if err := dec.Decode(&m); err != nil {
				return corrupt("", "metadata", "want an object: %v", jsonReason(err))
			}
			for k, v := range m {
				ix.Metadata[k] = numberValue(v)
			}
			return nil
		case "weight_map":
			haveMap = true
			var raw json.RawMessage
			if err := dec.Decode(&raw); err != nil {
				return corrupt("", "weight_map", "%v", jsonReason(err))
			}
			ix.WeightMap = map[string]string{}
			return walkObjectField(raw, func(tensor string, d *json.Decoder) error {
				var shard string
				if err := d.Decode(&shard); err != nil {
					return corrupt(tensor, "weight_map", "want a shard file name: %v", jsonReason(err))
				}
				if !filepath.IsLocal(shard) {
					return corrupt(tensor, "weight_map", "shard %q is not a file name inside the index's directory", shard)
				}
				ix.WeightMap[tensor] = shard
				return nil
			}, func(err error) error { return corrupt("", "weight_map", "%v", err) })
		default:
			var skip json.RawMessage
			return dec.Decode(&skip)
		}
	})
	if err != nil {
		var fe *format.Error
		if errors.As(err, &fe) {
			return nil, err
		}
		return nil, corrupt("", "", "%v", err)
	}
	if !haveMap {
		return nil, corrupt("", "weight_map", "missing")
	}
	return ix, nil
}

// walkObjectField is walkObject for a nested value, with structural errors
// turned into the caller's error type by wrap.
func walkObjectField(b []byte, fn func(key string, dec *json.Decoder) error, wrap func(error) error) error {
	err := walkObject(b, fn)
	var fe *format.Error
	if err != nil && !errors.As(err, &fe) {
		return wrap(err)
	}
	return err
}

func numberValue(v any) any {
	n, ok := v.(json.Number)
	if !ok {
		return v
	}
	if u, err := strconv.ParseUint(string(n), 10, 64); err == nil {
		return u
	}
	if i, err := strconv.ParseInt(string(n), 10, 64); err == nil {
		return i
	}
	f, _ := n.Float64()
	return f
}

// OpenIndex opens a sharded checkpoint through its index file: it parses the
// index, maps every shard it names (one mapping per shard) and checks each
// mapped tensor against its shard's header. Tensor.File is the shard's path
// (the index's directory joined with the shard name). Tensors present in a
// shard but absent from the weight map are left out. Errors name the index,
// the shard and the tensor; on error nothing stays mapped.
func (o Options) OpenIndex(path string) (*format.Model, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", FormatName, path, err)
	}
	b, err := io.ReadAll(io.LimitReader(f, MaxHeaderBytes+1))
	f.Close()
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", FormatName, path, err)
	}
	ix, err := ParseIndex(path, b)
	if err != nil {
		return nil, err
	}

	byShard := map[string][]string{}
	for tensor, shard := range ix.WeightMap {
		byShard[shard] = append(byShard[shard], tensor)
	}
	shards := make([]string, 0, len(byShard))
	for s := range byShard {
		shards = append(shards, s)
	}
	slices.Sort(shards)

	dir := filepath.Dir(path)
	files := map[string]*mmap.Mapping{}
	fail := func(err error) (*format.Model, error) {
		for _, m := range files {
			m.Close()
		}
		return nil, err
	}
	var tensors []format.Tensor
	for _, shard := range shards {
		sp := filepath.Join(dir, shard)
		mp, err := mmap.Open(sp)
		if err != nil {
			return fail(fmt.Errorf("%s index %s: shard %s: %w", FormatName, path, shard, err))
		}
		files[sp] = mp
		h, err := o.Parse(sp, mp.Bytes())
		if err != nil {
			return fail(fmt.Errorf("%s index %s: shard %s: %w", FormatName, path, shard, err))
		}
		inShard := make(map[string]int, len(h.Tensors))
		for i, t := range h.Tensors {
			inShard[t.Name] = i
		}
		names := byShard[shard]
		slices.Sort(names)
		for _, name := range names {
			i, ok := inShard[name]
			if !ok {
				return fail(&format.Error{Format: FormatName, File: path, Tensor: name, Field: "weight_map",
					Reason: fmt.Sprintf("mapped to shard %s, which does not contain it", shard), Kind: format.ErrCorrupt})
			}
			tensors = append(tensors, h.Tensors[i])
		}
	}
	return format.NewModel(path, FormatName, tensors, ix.Metadata, files), nil
}
