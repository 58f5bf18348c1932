package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestServeFleet serves two models sharing a budget that holds one of
// them whole, sends them concurrent requests (streamed and not) while the
// budget shrinks and grows through /admin/budget, and checks every
// response's greedy tokens against `memwall run` of that model alone; then
// the errors (no model, an unknown one, a budget below the minimums, a
// malformed one), the gauges after the load, and a drain on SIGTERM.
func TestServeFleet(t *testing.T) {
	a, _ := tinyDir(t, "tiny")
	b, _ := tinyDir(t, "tiny-f16")
	names := []string{"ma", "mb"}
	dirs := []string{a, b}
	prompts := []string{"5,17,300,42,9,77", "1,2,3", "700,600,500,400,300,200,100", "33"}
	const maxNew = 8
	want := map[string]string{}
	for i, dir := range dirs {
		for _, p := range prompts {
			out := runJSONOut(t, "run", dir, "--vram", "1GiB", "--prompt-ids", p, "--max-new", fmt.Sprint(maxNew), "--ignore-eos", "--device", "sim", "--json")
			want[names[i]+p] = fmt.Sprint(tokensOf(out))
		}
	}
	url, stop := startServe(t, a, b, "--model-name", "ma,mb", "--vram", "14MiB", "--max-seqs", "3", "--max-model-len", "64")
	post := func(path, body string) (int, []byte) {
		resp, err := http.Post(url+path, "application/json", strings.NewReader(body))
		if err != nil {
			return 0, []byte(err.Error())
		}
		defer resp.Body.Close()
		out, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, out
	}
	var st budgetJSON
	resp, err := http.Get(url + "/admin/budget")
	if err != nil {
		t.Fatal(err)
	}
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil || len(st.Models) != 2 {
		t.Fatalf("GET /admin/budget: %v %+v", err, st)
	}
	resp.Body.Close()
	lo := st.OverheadByte + st.Models[0].Minimum + st.Models[1].Minimum
	hi := st.VRAMBytes
	var wg sync.WaitGroup
	var mu sync.Mutex
	var fails []string
	fail := func(f string, a ...any) {
		mu.Lock()
		fails = append(fails, fmt.Sprintf(f, a...))
		mu.Unlock()
	}
	for k := range 12 {
		wg.Go(func() {
			name, p := names[k%2], prompts[(k/2)%len(prompts)]
			body := fmt.Sprintf(`{"model": %q, "prompt": [%s], "max_tokens": %d, "temperature": 0, "ignore_eos": true, "return_token_ids": true, "stream": %v}`,
				name, p, maxNew, k%3 == 0)
			code, out := post("/v1/completions", body)
			if got := fmt.Sprint(tokenIDsOf(out)); code != 200 || got != want[name+p] {
				fail("%s %s: %d %s, run alone %s", name, p, code, got, want[name+p])
			}
		})
	}
	wg.Go(func() {
		for i := range 6 {
			v := hi - uint64(i%2)*(hi-lo)/2
			if i == 5 {
				v = hi
			}
			if code, out := post("/admin/budget", fmt.Sprintf(`{"vram_bytes": %d}`, v)); code != 200 {
				fail("POST /admin/budget %d: %d %s", v, code, out)
			}
		}
	})
	wg.Wait()
	for _, f := range fails {
		t.Error(f)
	}
	resp, err = http.Get(url + "/admin/budget")
	if err != nil {
		t.Fatal(err)
	}
	st = budgetJSON{}
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil || st.Moves.PromotedBytes == 0 || st.Moves.DemotedBytes == 0 || st.VRAMBytes != hi {
		t.Errorf("after the load and the budget's moves: %v %+v", err, st)
	}
	resp.Body.Close()
	for _, c := range []struct {
		path, body string
		code       int
		want       string
	}{
		{"/v1/completions", `{"prompt": [1, 2], "max_tokens": 2}`, 400, "model is required"},
		{"/v1/completions", `{"model": "nope", "prompt": [1, 2], "max_tokens": 2}`, 404, "model_not_found"},
		{"/v1/completions", `{"model": "ma", "prompt": [1, 2], "max_tokens": 200}`, 400, "maximum context length is 64"},
		{"/v1/completions", `{"model": `, 400, "malformed JSON"},
		{"/admin/budget", fmt.Sprintf(`{"vram_bytes": %d}`, lo-1), 409, "below the models' minimum"},
		{"/admin/budget", `{"vram": "10GiB"}`, 400, "malformed"},
		{"/admin/budget", `{}`, 400, "vram_bytes is required"},
	} {
		if code, out := post(c.path, c.body); code != c.code || !bytes.Contains(out, []byte(c.want)) {
			t.Errorf("POST %s %s: %d %s, want %d with %q", c.path, c.body, code, out, c.code, c.want)
		}
	}
	resp, err = http.Get(url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	m, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, n := range names {
		for _, line := range []string{`vllm:num_requests_running{model_name="` + n + `"}`, `vllm:num_requests_waiting{model_name="` + n + `"}`,
			`vllm:kv_cache_usage_perc{model_name="` + n + `"}`} {
			i := bytes.Index(m, []byte(line))
			if i < 0 {
				t.Errorf("/metrics lacks %s", line)
				continue
			}
			if l, _, _ := strings.Cut(string(m[i:]), "\n"); !strings.HasSuffix(l, " 0") {
				t.Errorf("after the load: %s", l)
			}
		}
		if !bytes.Contains(m, []byte(`memwall_serve_grant_bytes{model_name="`+n+`"}`)) {
			t.Errorf("/metrics lacks %s's grant", n)
		}
	}
	if code, errOut := stop(); code != 0 || !strings.Contains(errOut, "drained") {
		t.Errorf("SIGTERM: exit %d: %s", code, errOut)
	}
}

// TestServeFleetUnload: with --unload-after 1 both idle models leave the
// fleet (GET /admin/budget lists none, their gauges say unloaded); a
// request loads its model again and gets `memwall run`'s tokens; the
// other stays off until asked.
func TestServeFleetUnload(t *testing.T) {
	a, _ := tinyDir(t, "tiny")
	b, _ := tinyDir(t, "tiny-f16")
	const p = "5,17,300,42,9,77"
	want := fmt.Sprint(tokensOf(runJSONOut(t, "run", b, "--vram", "1GiB", "--prompt-ids", p, "--max-new", "8", "--ignore-eos", "--device", "sim", "--json")))
	url, stop := startServe(t, a, b, "--model-name", "ma,mb", "--vram", "14MiB", "--max-seqs", "3", "--max-model-len", "64", "--unload-after", "1")
	shares := func() []string {
		resp, err := http.Get(url + "/admin/budget")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var st budgetJSON
		if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, m := range st.Models {
			names = append(names, m.Name)
		}
		return names
	}
	metrics := func() string {
		resp, err := http.Get(url + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		m, _ := io.ReadAll(resp.Body)
		return string(m)
	}
	if got := shares(); len(got) != 2 {
		t.Fatalf("at start the fleet holds %v", got)
	}
	deadline := time.Now().Add(10 * time.Second)
	for len(shares()) > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("after 10 s idle the fleet still holds %v", shares())
		}
		time.Sleep(50 * time.Millisecond)
	}
	if m := metrics(); !strings.Contains(m, `memwall_serve_loaded{model_name="ma"} 0`) || !strings.Contains(m, `memwall_serve_unloads_total{model_name="mb"} 1`) {
		t.Fatalf("unloaded, /metrics:\n%s", m)
	}
	body := fmt.Sprintf(`{"model": "mb", "prompt": [%s], "max_tokens": 8, "temperature": 0, "ignore_eos": true, "return_token_ids": true}`, p)
	resp, err := http.Post(url+"/v1/completions", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	out, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if got := fmt.Sprint(tokenIDsOf(out)); resp.StatusCode != 200 || got != want {
		t.Fatalf("mb loaded again: %d %s, run alone %s", resp.StatusCode, out, want)
	}
	if got := shares(); len(got) != 1 || got[0] != "mb" {
		t.Errorf("after mb's request the fleet holds %v", got)
	}
	if m := metrics(); !strings.Contains(m, `memwall_serve_loads_total{model_name="mb"} 1`) || !strings.Contains(m, `memwall_serve_loads_total{model_name="ma"} 0`) {
		t.Errorf("loads in /metrics:\n%s", m)
	}
	if code, errOut := stop(); code != 0 || !strings.Contains(errOut, "unloaded") {
		t.Errorf("SIGTERM: exit %d: %s", code, errOut)
	}
}

// TestServeConfig: --config names the models with their own priority,
// keep-alive and unload-after (a relative path resolved against the
// file's directory); the higher priority holds its whole model in a budget
// that holds one, whichever order the file lists them in, and serving
// answers as with MODEL arguments.
func TestServeConfig(t *testing.T) {
	a, _ := tinyDir(t, "tiny")
	b, _ := tinyDir(t, "tiny-f16")
	cfgDir := filepath.Dir(a)
	for _, high := range []string{"ma", "mb"} {
		pa, pb := 1, 5
		if high == "ma" {
			pa, pb = 5, 1
		}
		cfg := filepath.Join(cfgDir, "serve-"+high+".json")
		body := fmt.Sprintf(`{"models": [
  {"path": %q, "name": "ma", "priority": %d, "keep_alive_s": -1},
  {"path": %q, "name": "mb", "priority": %d, "keep_alive_s": -1, "unload_after_s": 0}
]}`, filepath.Base(a), pa, b, pb)
		if err := os.WriteFile(cfg, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		url, stop := startServe(t, "--config", cfg, "--vram", "14MiB", "--max-seqs", "3", "--max-model-len", "64")
		budget := func() budgetJSON {
			resp, err := http.Get(url + "/admin/budget")
			if err != nil {
				t.Fatal(err)
			}
			var st budgetJSON
			err = json.NewDecoder(resp.Body).Decode(&st)
			resp.Body.Close()
			if err != nil || len(st.Models) != 2 {
				t.Fatalf("GET /admin/budget: %v %+v", err, st)
			}
			return st
		}
		// A budget that holds the whole of either model and the other's
		// minimum, not both whole.
		st := budget()
		m0, m1 := st.Models[0], st.Models[1]
		v := st.OverheadByte + max(m0.Full+m1.Minimum, m1.Full+m0.Minimum) + 1<<20
		if v >= st.OverheadByte+m0.Full+m1.Full {
			t.Fatalf("the models' figures leave no budget between: %+v", st)
		}
		if code, out := postJSON(t, url+"/admin/budget", fmt.Sprintf(`{"vram_bytes": %d}`, v)); code != 200 {
			t.Fatalf("POST /admin/budget %d: %d %s", v, code, out)
		}
		for _, m := range budget().Models {
			whole := m.Grant == m.Full
			if (m.Name == high) != whole || (m.Name == high) != (m.Priority == 5) {
				t.Errorf("%s high: %s priority %v holds %d of its whole %d", high, m.Name, m.Priority, m.Grant, m.Full)
			}
		}
		code, out := postJSON(t, url+"/v1/completions", `{"model": "ma", "prompt": [5, 17, 300], "max_tokens": 4, "temperature": 0, "ignore_eos": true}`)
		if code != 200 {
			t.Errorf("a completion: %d %s", code, out)
		}
		if c, errOut := stop(); c != 0 {
			t.Fatalf("serve exited %d: %s", c, errOut)
		}
	}
}

// TestServeConfigErrors: a bad --config file, or one given with MODEL
// arguments or --model-name, fails before anything loads, naming the file
// and the field.
func TestServeConfigErrors(t *testing.T) {
	a, _ := tinyDir(t, "tiny")
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	good := write("good.json", fmt.Sprintf(`{"models": [{"path": %q}]}`, a))
	for _, c := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"--config", good, a}, 2, "give the models one way"},
		{[]string{"--config", good, "--model-name", "x"}, 2, "name the models in the file"},
		{[]string{"--config", filepath.Join(dir, "none.json")}, 1, "none.json"},
		{[]string{"--config", write("empty.json", "")}, 1, "empty.json: empty"},
		{[]string{"--config", write("nomodels.json", `{"models": []}`)}, 1, "models: want at least one"},
		{[]string{"--config", write("unknown.json", `{"models": [{"path": "x", "prio": 2}]}`)}, 1, `unknown field "prio"`},
		{[]string{"--config", write("syntax.json", "{\n  \"models\": [\n    {\"path\": \"x\",}\n  ]\n}")}, 1, "line 3"},
		{[]string{"--config", write("type.json", `{"models": [{"path": 3}]}`)}, 1, "models.path: want string"},
		{[]string{"--config", write("nopath.json", `{"models": [{"name": "a"}]}`)}, 1, "models[0].path: missing"},
		{[]string{"--config", write("prio.json", fmt.Sprintf(`{"models": [{"path": %q, "priority": 0}]}`, a))}, 1, "models[0].priority: 0"},
		{[]string{"--config", write("keep.json", fmt.Sprintf(`{"models": [{"path": %q, "keep_alive_s": -2}]}`, a))}, 1, "models[0].keep_alive_s: -2"},
		{[]string{"--config", write("unload.json", fmt.Sprintf(`{"models": [{"path": %q, "unload_after_s": -1}]}`, a))}, 1, "models[0].unload_after_s: -1"},
		{[]string{"--config", write("dup.json", fmt.Sprintf(`{"models": [{"path": %q, "name": "m"}, {"path": %q, "name": "m"}]}`, a, a))}, 1, `models[1].name: "m" names models[0] too`},
		{[]string{"--config", write("missing.json", `{"models": [{"path": "not-here.gguf"}]}`)}, 1, "not-here.gguf"},
		{[]string{"--config", write("two.json", fmt.Sprintf(`{"models": [{"path": %q}]} {}`, a))}, 1, "more than one JSON value"},
	} {
		code, _, errOut := runVerbSim(t, append([]string{"serve"}, c.args...)...)
		if code != c.code || !strings.Contains(errOut, c.want) {
			t.Errorf("serve %v: exit %d, want %d with %q: %s", c.args, code, c.code, c.want, errOut)
		}
	}
}

// postJSON posts body to url and returns the status and the answer.
func postJSON(t *testing.T, url, body string) (int, string) {
	t.Helper()
	resp, err := http.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	out, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(out)
}
