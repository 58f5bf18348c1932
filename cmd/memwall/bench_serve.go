package main

import (
	"fmt"
	"net/url"
	"sync"

	"github.com/memwall/memwall/bench"
)

func init() { benchVerbs["serve"] = runBenchServe }

const benchServeUsage = `--url URL (--synthetic sharegpt|alpaca|shared-prefix | --requests FILE.jsonl) [--concurrency N] [--n N] [--model NAME] [--api-key KEY] [--vocab N] [--max-len N] [--json]

A load generator for any OpenAI-compatible server (memwall serve, vLLM,
llama.cpp's llama-server): --concurrency clients send the requests as
streamed completions, each the next one as soon as its last ended. A
request's prompt is its prompt_tokens token ids (drawn below --vocab; a
shared prefix_id gives the same first prefix_tokens), its max_tokens its
output_tokens, with ignore_eos so that it generates them all; arrival times
are not used. Reports aggregate output tokens/s, time to first token and
inter-token latency (between two streamed chunks), end-to-end latency and
one request's decode rate, p50 and p99 (for the rate: the rate all but the
slowest 1% reach).`

func runBenchServe(e *env, args []string) error {
	fs := newFlags(e, "bench serve", benchServeUsage)
	u := fs.String("url", "", "the server's base URL, e.g. http://127.0.0.1:8080")
	requests := fs.String("requests", "", "request file: JSON lines with prompt_tokens, output_tokens[, prefix_id, prefix_tokens] (arrival_s is read, not used)")
	synthetic := fs.String("synthetic", "", "synthetic mix: sharegpt, alpaca or shared-prefix")
	n := intFlagOf(fs, "n", 100, 1, 1<<20, "synthetic requests")
	conc := intFlagOf(fs, "concurrency", 8, 1, 4096, "clients sending at once")
	vocab := intFlagOf(fs, "vocab", 1000, 11, 1<<24, "prompt token ids are drawn from 10 up to this")
	maxLen := intFlagOf(fs, "max-len", 2048, 8, 1<<24, "synthetic prompt + output bound (the server's context)")
	seed := fs.Uint64("seed", 1, "seed of the synthetic mix and the token ids")
	model := fs.String("model", "", "the requests' model field (default: none)")
	key := fs.String("api-key", "", "send Authorization: Bearer KEY")
	asJSON := fs.Bool("json", false, "print one JSON object")
	pos, err := parseFlags(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 0 {
		return usagef("unexpected arguments %q", pos)
	}
	if pu, err := url.Parse(*u); *u == "" || err != nil || pu.Scheme != "http" && pu.Scheme != "https" || pu.Host == "" {
		return usagef("--url %q: want http://host:port", *u)
	}
	if (*requests == "") == (*synthetic == "") {
		return usagef("give one of --requests FILE or --synthetic sharegpt|alpaca|shared-prefix")
	}
	switch *synthetic {
	case "", "sharegpt", "alpaca", "shared-prefix":
	default:
		return usagef("--synthetic %q: want sharegpt, alpaca or shared-prefix", *synthetic)
	}
	if err := checkFiles(e, []input{{"--requests", *requests}}); err != nil {
		return err
	}
	reqs, source, err := kvRequests(e.ctx, *requests, *synthetic, *n, *seed, 0, *maxLen)
	if err != nil {
		return err
	}
	bar := newProgress(e, "bench serve")
	bar.unit = "requests"
	var mu sync.Mutex
	res, err := bench.Serve(e.ctx, bench.ServeOptions{URL: *u, Model: *model, APIKey: *key, Requests: reqs, Concurrency: *conc, Vocab: *vocab, Seed: *seed,
		Progress: func(done, total int) {
			mu.Lock()
			bar.update(float64(done), float64(total), fmt.Sprintf("%d of %d requests", done, total))
			mu.Unlock()
		}})
	bar.done()
	if err != nil {
		return err
	}
	if *asJSON {
		return writeJSON(e.stdout, struct {
			URL    string `json:"url"`
			Source string `json:"requests_from"`
			bench.ServeResult
		}{*u, source, res})
	}
	w := e.stdout
	fmt.Fprintf(w, "%s: %d requests from %s, %d clients, %d failed\n", *u, res.Requests, source, res.Concurrency, res.Failed)
	fmt.Fprintf(w, "  %d prompt and %d output tokens in %.2f s: %.1f output tokens/s, %.2f requests/s\n",
		res.PromptTokens, res.OutputTokens, res.WallSeconds, res.OutputTokensPerS, res.RequestsPerS)
	fmt.Fprintf(w, "  time to first token  p50 %8.1f ms  p99 %8.1f ms\n", 1e3*res.TTFTP50, 1e3*res.TTFTP99)
	fmt.Fprintf(w, "  inter-token latency  p50 %8.2f ms  p99 %8.2f ms\n", 1e3*res.ITLP50, 1e3*res.ITLP99)
	fmt.Fprintf(w, "  end to end           p50 %8.2f s   p99 %8.2f s\n", res.E2EP50, res.E2EP99)
	fmt.Fprintf(w, "  one request's decode p50 %8.1f tok/s (99%% of requests reach %.1f)\n", res.RequestTokensPerSP50, res.RequestTokensPerSP99)
	if res.FirstError != "" {
		fmt.Fprintf(w, "  first failure: %s\n", res.FirstError)
	}
	return nil
}
