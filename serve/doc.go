// Package serve is an OpenAI-compatible HTTP server over an engine.Batch,
// with continuous batching: requests join and leave the batch between
// steps, each step runs every running sequence's next prompt chunk or
// decode token under a token budget (the engine's prefill chunk), and
// admission, growth and preemption follow kvcache/sched's policy (first
// come first served while the blocks fit above a watermark; a sequence
// that needs a block when none is free preempts the latest admitted,
// whose blocks are freed and whose tokens are computed again on
// readmission). A client that goes away stops its sequence and frees its
// blocks before the next step.
//
// Endpoints: POST /v1/completions (prompt as text or token ids), POST
// /v1/chat/completions (the model's chat template through a Jinja engine),
// GET /v1/models, GET /health, GET /metrics (vLLM's metric names with
// model_name, and memwall's own). Streaming is server-sent events ending in
// "data: [DONE]". Errors are OpenAI's error JSON.
//
// Quick start:
//
//	b, _ := eng.NewBatch(32)
//	s, _ := serve.New(b, serve.Options{ModelName: "llama", Tokenizer: tok, IsEOS: m.Config.IsEOS})
//	go s.Run(ctx)
//	http.ListenAndServe("127.0.0.1:8080", s.Handler())
//
// Several models, each a Server over its own batch (Options.Sharing: the
// budget they share, package fleet), are served on one address by a
// Group: requests name their model, and GET/POST /admin/budget read and
// change the shared budget. With Options.Unloader and UnloadAfter, a model
// idle that long is unloaded (Unloader.Unload) and loaded again by the
// next request (Unloader.Load), which waits for it; a failed load ends the
// waiting requests with 503.
package serve
