package trace

import (
	"bytes"
	"compress/gzip"
	"io"
	"os"
	"testing"
)

// Reading benchmarks report events/s over whole files: what a replayer
// can be fed with. Run with -benchtime=5x (each iteration reads a file).
//
//	go test -run='^$' -bench=Read -benchtime=5x ./trace

func benchRead(b *testing.B, data []byte, name string, opts Options) {
	b.Helper()
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	var events int64
	for b.Loop() {
		r, err := NewReader(bytes.NewReader(data), name, opts)
		if err != nil {
			b.Fatal(err)
		}
		for {
			if _, err := r.Next(); err == io.EOF {
				break
			} else if err != nil {
				b.Fatal(err)
			}
		}
		events += r.Stats().Events
	}
	b.ReportMetric(float64(events)/b.Elapsed().Seconds(), "events/s")
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(events), "ns/event")
}

func readFile(b *testing.B, path string) []byte {
	data, err := os.ReadFile(path)
	if err != nil {
		b.Fatal(err)
	}
	return data
}

func gunzip(b *testing.B, data []byte) []byte {
	zr, err := gzip.NewReader(bytes.NewReader(data))
	if err != nil {
		b.Fatal(err)
	}
	out, err := io.ReadAll(zr)
	if err != nil {
		b.Fatal(err)
	}
	return out
}

func BenchmarkReadCSV(b *testing.B) {
	gz := readFile(b, "../testdata/traces/gpt2_medium_generate.csv.gz")
	plain := gunzip(b, gz)
	b.Run("gpt2.csv.gz", func(b *testing.B) { benchRead(b, gz, "gpt2.csv.gz", Options{}) })
	b.Run("gpt2.csv.gz/novalidate", func(b *testing.B) { benchRead(b, gz, "gpt2.csv.gz", Options{NoValidate: true}) })
	b.Run("gpt2.csv", func(b *testing.B) { benchRead(b, plain, "gpt2.csv", Options{}) })
	b.Run("gpt2.csv/novalidate", func(b *testing.B) { benchRead(b, plain, "gpt2.csv", Options{NoValidate: true}) })
	bert := readFile(b, "../testdata/traces/bert_base_varlen.csv.gz")
	b.Run("bert.csv.gz", func(b *testing.B) { benchRead(b, bert, "bert.csv.gz", Options{}) })
}

func BenchmarkReadSnapshot(b *testing.B) {
	gz := readFile(b, "../testdata/traces/bert_base_varlen.pickle.gz")
	plain := gunzip(b, gz)
	b.Run("bert.pickle.gz", func(b *testing.B) { benchRead(b, gz, "bert.pickle.gz", Options{}) })
	b.Run("bert.pickle", func(b *testing.B) { benchRead(b, plain, "bert.pickle", Options{}) })
	b.Run("bert.pickle/novalidate", func(b *testing.B) { benchRead(b, plain, "bert.pickle", Options{NoValidate: true}) })
}

func BenchmarkReadJSONL(b *testing.B) {
	evs, _ := openAll(b, "../testdata/traces/gpt2_medium_generate.csv.gz", Options{})
	var buf bytes.Buffer
	w := NewWriter(&buf)
	for i, ev := range evs {
		ev.Time = int64(i) * 1000
		ev.Tenant, ev.Purpose = "llm", "activations"
		if err := w.Write(ev); err != nil {
			b.Fatal(err)
		}
	}
	if err := w.Flush(); err != nil {
		b.Fatal(err)
	}
	b.Run("gpt2.jsonl", func(b *testing.B) { benchRead(b, buf.Bytes(), "gpt2.jsonl", Options{}) })
	b.Run("gpt2.jsonl/novalidate", func(b *testing.B) { benchRead(b, buf.Bytes(), "gpt2.jsonl", Options{NoValidate: true}) })
}

func BenchmarkWriter(b *testing.B) {
	w := NewWriter(io.Discard)
	ev := Event{Action: Alloc, Addr: 139828359974912, Size: 9568, Time: 1700000000123456789, Tenant: "llm", Purpose: "activations"}
	b.ReportAllocs()
	for b.Loop() {
		ev.Addr += 512
		if err := w.Write(ev); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "events/s")
}
