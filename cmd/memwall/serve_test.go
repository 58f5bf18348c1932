package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// startServe runs `memwall serve ARGS --json --addr 127.0.0.1:0` in-process
// and returns its URL, a function that sends SIGTERM and returns the exit
// status and stderr.
func startServe(t *testing.T, args ...string) (url string, stop func() (int, string)) {
	t.Helper()
	ctx, in := interruptible(context.Background())
	pr, pw := io.Pipe()
	var errOut bytes.Buffer
	env := &env{ctx: ctx, stop: in, stdout: pw, stderr: &errOut, getenv: func(string) string { return "" }}
	code := make(chan int, 1)
	go func() {
		c := run(append(append([]string{"serve"}, args...), "--json", "--addr", "127.0.0.1:0", "--device", "sim"), env)
		pw.Close()
		code <- c
	}()
	var out serveJSON
	if err := json.NewDecoder(pr).Decode(&out); err != nil {
		c := <-code
		t.Fatalf("serve exited %d before listening: %v\n%s", c, err, errOut.String())
	}
	go io.Copy(io.Discard, pr)
	var once sync.Once
	var c int
	stop = func() (int, string) {
		once.Do(func() {
			in.signal(syscall.SIGTERM)
			select {
			case c = <-code:
			case <-time.After(20 * time.Second):
				t.Fatal("serve did not stop within 20 s of SIGTERM")
			}
		})
		return c, errOut.String()
	}
	t.Cleanup(func() { stop() })
	return out.URL, stop
}

// TestServeMatchesRun sends concurrent streamed and whole requests to
// `memwall serve` and checks each one's greedy tokens against `memwall run`
// for the same prompt, then that SIGTERM drains and exits 0 with nothing
// left running.
func TestServeMatchesRun(t *testing.T) {
	dir, _ := tinyDir(t, "tiny")
	prompts := []string{"5,17,300,42,9,77", "1,2,3", "900,800,700,600,500,400,300,200,100", "33", "4,4,4,4,4,4,4,4,4,4,4,4,4,4,4,4,4,4,4,4"}
	const maxNew = 10
	var want []string
	for _, p := range prompts {
		out := runJSONOut(t, "run", dir, "--vram", "1GiB", "--prompt-ids", p, "--max-new", fmt.Sprint(maxNew), "--ignore-eos", "--device", "sim", "--json")
		want = append(want, fmt.Sprint(tokensOf(out)))
	}
	url, stop := startServe(t, dir, "--vram", "1GiB", "--max-seqs", "3", "--max-model-len", "128")
	var wg sync.WaitGroup
	got := make([]string, len(prompts))
	for i, p := range prompts {
		wg.Go(func() {
			ids := "[" + p + "]"
			body := fmt.Sprintf(`{"prompt": %s, "max_tokens": %d, "temperature": 0, "ignore_eos": true, "return_token_ids": true, "stream": %v}`, ids, maxNew, i%2 == 1)
			resp, err := http.Post(url+"/v1/completions", "application/json", strings.NewReader(body))
			if err != nil {
				got[i] = err.Error()
				return
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			got[i] = fmt.Sprint(tokenIDsOf(b))
		})
	}
	wg.Wait()
	for i := range prompts {
		if got[i] != want[i] {
			t.Errorf("prompt %s: serve %s, run %s", prompts[i], got[i], want[i])
		}
	}
	resp, err := http.Get(url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	m, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, line := range []string{`vllm:num_requests_running{model_name="`, `vllm:num_requests_waiting{model_name="`, `vllm:kv_cache_usage_perc{model_name="`} {
		i := bytes.Index(m, []byte(line))
		if i < 0 {
			t.Errorf("/metrics lacks %s", line)
			continue
		}
		if l, _, _ := strings.Cut(string(m[i:]), "\n"); !strings.HasSuffix(l, " 0") {
			t.Errorf("after the load: %s", l)
		}
	}
	if code, errOut := stop(); code != 0 || !strings.Contains(errOut, "drained") {
		t.Errorf("SIGTERM: exit %d: %s", code, errOut)
	}
}

// tokenIDsOf reads the token ids of a completion, whole or streamed.
func tokenIDsOf(b []byte) []int {
	var ids []int
	for _, part := range bytes.Split(b, []byte("\n")) {
		part = bytes.TrimPrefix(bytes.TrimSpace(part), []byte("data: "))
		if len(part) == 0 || string(part) == "[DONE]" {
			continue
		}
		var c struct {
			Choices []struct {
				TokenIDs []int `json:"token_ids"`
			} `json:"choices"`
		}
		if json.Unmarshal(part, &c) == nil {
			for _, ch := range c.Choices {
				ids = append(ids, ch.TokenIDs...)
			}
		}
	}
	return ids
}

func TestServeUsage(t *testing.T) {
	dir, _ := tinyDir(t, "tiny")
	for _, c := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"serve"}, 2, "want a MODEL argument"},
		{[]string{"serve", dir, "--max-seqs", "0"}, 2, "at least 1"},
		{[]string{"serve", dir, "--addr", "nonsense"}, 2, "--addr"},
		{[]string{"serve", dir, "--drain-seconds", "7200"}, 2, "at most 3600"},
		{[]string{"serve", dir, "--max-model-len", "100000", "--device", "sim"}, 2, "above the model's context of 512"},
		{[]string{"serve", dir, "--vram", "2MiB", "--device", "sim"}, 1, "minimum"},
	} {
		code, _, errOut := runVerbSim(t, c.args...)
		if code != c.code || !strings.Contains(errOut, c.want) {
			t.Errorf("%v: exit %d, %s", c.args, code, errOut)
		}
	}
}

// TestBenchServe runs the load generator against memwall serve.
func TestBenchServe(t *testing.T) {
	dir, _ := tinyDir(t, "tiny")
	url, stop := startServe(t, dir, "--vram", "1GiB", "--max-seqs", "4", "--max-model-len", "128")
	out := runJSONOut(t, "bench", "serve", "--url", url, "--synthetic", "alpaca", "--n", "6", "--max-len", "100", "--concurrency", "3", "--json")
	if out["requests"].(float64) != 6 || out["failed"].(float64) != 0 || out["output_tokens"].(float64) < 6 || out["ttft_p50_s"].(float64) <= 0 ||
		out["output_tokens_per_s"].(float64) <= 0 || out["itl_p99_s"].(float64) < out["itl_p50_s"].(float64) {
		t.Errorf("bench serve: %v", out)
	}
	code, human, errOut := runVerbSim(t, "bench", "serve", "--url", url, "--synthetic", "alpaca", "--n", "2", "--max-len", "100")
	if code != 0 || !strings.Contains(human, "output tokens/s") || !strings.Contains(human, "time to first token") {
		t.Errorf("human: exit %d: %s%s", code, human, errOut)
	}
	// SIGINT stops the load within a second, saying how many requests
	// were done.
	code, errOut, late := runInterrupted(t, os.Interrupt, 400*time.Millisecond, "bench", "serve", "--url", url, "--synthetic", "alpaca", "--n", "100000", "--max-len", "100", "--concurrency", "3")
	if late < 0 || late > time.Second || code != exitSIGINT || !regexp.MustCompile(`^memwall bench serve: interrupted by SIGINT after [0-9]+ of 100000 requests\b`).MatchString(errOut) {
		t.Errorf("bench serve interrupted: exit %d, %v after the signal, stderr %q", code, late, errOut)
	}
	// On a terminal the bar counts requests, and so does the work
	// recorded for an interrupted run's message.
	var ran *env
	code, _, errOut = runEnv(t, func(e *env) { e.terminal, ran = true, e }, "bench", "serve", "--url", url, "--synthetic", "alpaca", "--n", "2", "--max-len", "100")
	if code != 0 || !strings.Contains(errOut, "\rbench serve [") || !strings.Contains(errOut, "100% 2 of 2 requests") || ran.work.String() != "2 of 2 requests" {
		t.Errorf("on a terminal: exit %d, stderr %q, work %q", code, errOut, ran.work.String())
	}
	if code, _ := stop(); code != 0 {
		t.Errorf("serve exit %d", code)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"bench", "serve", "--synthetic", "alpaca"}, "--url"},
		{[]string{"bench", "serve", "--url", "ftp://x", "--synthetic", "alpaca"}, "--url"},
		{[]string{"bench", "serve", "--url", url}, "give one of"},
		{[]string{"bench", "serve", "--url", url, "--synthetic", "nope"}, "--synthetic"},
		{[]string{"bench", "serve", "--url", url, "--synthetic", "alpaca", "--concurrency", "0"}, "at least 1"},
	} {
		if code, _, errOut := runVerbSim(t, c.args...); code != 2 || !strings.Contains(errOut, c.want) {
			t.Errorf("%v: exit %d: %s", c.args, code, errOut)
		}
	}
	// A server that is gone fails every request: exit 1.
	if code, _, errOut := runVerbSim(t, "bench", "serve", "--url", url, "--synthetic", "alpaca", "--n", "2"); code != 1 || !strings.Contains(errOut, "failed") {
		t.Errorf("no server: exit %d: %s", code, errOut)
	}
}
