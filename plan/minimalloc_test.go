package plan

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// minimallocDir holds Google MiniMalloc's "challenging" benchmark instances
// (Apache-2.0, see its README), each to fit in 1,048,576 bytes.
const minimallocDir = "../testdata/minimalloc"

const minimallocCapacity = 1 << 20

func readInstance(t testing.TB, name string) []Buffer {
	t.Helper()
	f, err := os.Open(filepath.Join(minimallocDir, name))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	bufs, err := ReadMinimallocCSV(f, name)
	if err != nil {
		t.Fatal(err)
	}
	return bufs
}

// TestMinimallocInstances is the acceptance test of the search: every
// shared instance fits its 1,048,576-byte capacity within the default 5 s
// limit. The greedy planners alone need 1.29-1.37x the lower bound. Under
// the race detector, which slows the search 10-20x, only the two quickest
// instances run, with a minute each.
func TestMinimallocInstances(t *testing.T) {
	files, err := filepath.Glob(filepath.Join(minimallocDir, "*.csv"))
	if err != nil || len(files) != 6 {
		t.Fatalf("want the 6 instances in %s, got %v (%v)", minimallocDir, files, err)
	}
	opts := Options{Capacity: minimallocCapacity}
	if raceEnabled {
		opts.TimeLimit = time.Minute
	}
	for _, f := range files {
		name := filepath.Base(f)
		t.Run(name, func(t *testing.T) {
			if raceEnabled && name != "A.1048576.csv" && name != "F.1048576.csv" {
				t.Skip("too slow under the race detector")
			}
			t.Parallel()
			bufs := readInstance(t, name)
			start := time.Now()
			l, rep, err := Solve(context.Background(), bufs, opts)
			took := time.Since(start)
			if err != nil {
				t.Fatal(err)
			}
			var greedy uint64 = 1<<64 - 1
			for _, r := range rep.Runs {
				if r.Algorithm != AlgorithmSearch {
					greedy = min(greedy, r.ArenaBytes)
				}
			}
			last := rep.Runs[len(rep.Runs)-1]
			t.Logf("%s: %d buffers, lower bound %d, best greedy %d (%.2fx), final %d by %s, %.2f s, %d search nodes",
				name, len(bufs), rep.LowerBoundBytes, greedy, float64(greedy)/float64(rep.LowerBoundBytes),
				l.ArenaBytes, l.Algorithm, took.Seconds(), last.Nodes)
			if !rep.Fits || l.ArenaBytes > minimallocCapacity {
				t.Fatalf("arena %d does not fit %d: runs %+v", l.ArenaBytes, minimallocCapacity, rep.Runs)
			}
			if err := Verify(bufs, l); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func TestReadMinimallocCSV(t *testing.T) {
	tests := []struct {
		name  string
		input string
		want  []Buffer
		err   string // substring; "" for success
	}{
		{"example", "id,lower,upper,size\nb1,0,3,4\nb2,3,9,4\n",
			[]Buffer{{ID: "b1", Start: 0, End: 3, Size: 4}, {ID: "b2", Start: 3, End: 9, Size: 4}}, ""},
		{"columns in any order, offset ignored, spaces, CRLF, BOM", "\ufeffsize, upper ,lower,id,offset\r\n4,3,0,b1,8\r\n",
			[]Buffer{{ID: "b1", Start: 0, End: 3, Size: 4}}, ""},
		{"header only", "id,lower,upper,size\n", nil, ""},
		{"negative times", "id,lower,upper,size\nx,-5,-1,1\n", []Buffer{{ID: "x", Start: -5, End: -1, Size: 1}}, ""},
		{"empty file", "", nil, "t.csv: empty file"},
		{"missing column", "id,lower,size\n", nil, `t.csv:1: field "upper": missing column`},
		{"unknown column", "id,lower,upper,size,color\n", nil, `t.csv:1: field "color": unknown column`},
		{"duplicate column", "id,lower,upper,size,id\n", nil, `field "id": column given twice`},
		{"bad number", "id,lower,upper,size\nb1,0,3,4\nb2,0,3x,4\n", nil, `t.csv:3: field "upper": "3x": not an integer`},
		{"negative size", "id,lower,upper,size\nb1,0,3,-4\n", nil, `t.csv:2: field "size": "-4"`},
		{"upper not above lower", "id,lower,upper,size\nb1,5,5,4\n", nil, `t.csv:2: field "upper": 5 not above lower 5`},
		{"size zero", "id,lower,upper,size\nb1,0,1,0\n", nil, `t.csv:2: field "size": 0`},
		{"size too big", "id,lower,upper,size\nb1,0,1,1099511627777\n", nil, `exceeds the limit`},
		{"time too big", "id,lower,upper,size\nb1,0,9999999999999999,1\n", nil, `field "upper"`},
		{"duplicate id", "id,lower,upper,size\nb1,0,1,1\nb1,1,2,1\n", nil, `t.csv:3: field "id": "b1" already used on line 2`},
		{"empty id", "id,lower,upper,size\n,0,1,1\n", nil, `field "id": empty`},
		{"ragged row", "id,lower,upper,size\nb1,0,1\n", nil, `t.csv:2: wrong number of fields`},
		{"bad quote", "id,lower,upper,size\n\"b1,0,1,1\n", nil, `t.csv`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ReadMinimallocCSV(strings.NewReader(tc.input), "t.csv")
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err = %v, want one containing %q", err, tc.err)
				}
				if !errors.Is(err, ErrFormat) {
					t.Errorf("err %v does not wrap ErrFormat", err)
				}
				var ce *CSVError
				if !errors.As(err, &ce) || ce.File != "t.csv" {
					t.Errorf("err %v is not a *CSVError naming the file", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestReadMinimallocCSVTooMany(t *testing.T) {
	var b bytes.Buffer
	b.WriteString("id,lower,upper,size\n")
	for i := range MaxBuffers + 1 {
		b.WriteString("x" + strconv.Itoa(i) + ",0,1,1\n")
	}
	_, err := ReadMinimallocCSV(&b, "big.csv")
	if !errors.Is(err, ErrFormat) || !strings.Contains(err.Error(), "more than 65536 buffers") {
		t.Fatalf("err = %v", err)
	}
}

type failingReader struct{}

func (failingReader) Read([]byte) (int, error) { return 0, errors.New("disk on fire") }

func TestReadMinimallocCSVReadError(t *testing.T) {
	_, err := ReadMinimallocCSV(failingReader{}, "f.csv")
	if err == nil || !strings.Contains(err.Error(), "f.csv") || !strings.Contains(err.Error(), "disk on fire") {
		t.Fatalf("err = %v", err)
	}
}

func TestWriteMinimallocCSVRoundTrip(t *testing.T) {
	bufs := readInstance(t, "A.1048576.csv")
	l, err := GreedyBySize(bufs, 0)
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := WriteMinimallocCSV(&out, bufs, &l); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(out.String(), "id,lower,upper,size,offset\n") {
		t.Errorf("header: %q", strings.SplitN(out.String(), "\n", 2)[0])
	}
	back, err := ReadMinimallocCSV(&out, "round trip")
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(back, bufs) {
		t.Error("buffers changed in a write/read round trip")
	}
	if err := WriteMinimallocCSV(&out, bufs, &Layout{}); !errors.Is(err, ErrInvalid) {
		t.Errorf("mismatched layout: err = %v", err)
	}
}

// FuzzReadMinimallocCSV feeds the reader arbitrary bytes: it must not panic,
// and what it accepts must be a valid instance that survives a write/read
// round trip and plans into a verified layout.
func FuzzReadMinimallocCSV(f *testing.F) {
	for _, s := range []string{
		"id,lower,upper,size\nb1,0,3,4\nb2,3,9,4\nb3,0,9,4\nb4,9,21,4\nb5,0,21,4\n",
		"size,upper,lower,id,offset\n4,3,0,b1,8\n",
		"id,lower,upper,size\n\"a,b\",-3,7,100\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		bufs, err := ReadMinimallocCSV(bytes.NewReader(data), "fuzz.csv")
		if err != nil {
			if !errors.Is(err, ErrFormat) {
				t.Fatalf("error %v does not wrap ErrFormat", err)
			}
			return
		}
		if err := Validate(bufs, 0); err != nil {
			t.Fatalf("accepted an invalid instance: %v", err)
		}
		var out bytes.Buffer
		if err := WriteMinimallocCSV(&out, bufs, nil); err != nil {
			t.Fatal(err)
		}
		back, err := ReadMinimallocCSV(&out, "again.csv")
		if err != nil {
			t.Fatalf("cannot read back what was written: %v\n%s", err, out.String())
		}
		if !slices.Equal(back, bufs) {
			t.Fatalf("round trip changed the buffers")
		}
		if len(bufs) <= 200 {
			l, _, err := Solve(context.Background(), bufs, Options{NodeLimit: 2000, TimeLimit: time.Second})
			if err != nil {
				t.Fatal(err)
			}
			if err := Verify(bufs, l); err != nil {
				t.Fatal(err)
			}
		}
	})
}

// BenchmarkSolveMinimalloc times the portfolio on each shared instance at
// its capacity and reports the search nodes and the arena over the lower
// bound.
func BenchmarkSolveMinimalloc(b *testing.B) {
	files, _ := filepath.Glob(filepath.Join(minimallocDir, "*.csv"))
	for _, f := range files {
		name := filepath.Base(f)
		b.Run(name, func(b *testing.B) {
			bufs := readInstance(b, name)
			var rep Report
			for b.Loop() {
				var err error
				if _, rep, err = Solve(context.Background(), bufs, Options{Capacity: minimallocCapacity}); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(rep.Runs[len(rep.Runs)-1].Nodes), "nodes")
			b.ReportMetric(float64(rep.ArenaBytes)/float64(rep.LowerBoundBytes), "arena/lb")
		})
	}
}
