#!/usr/bin/env bash
# Rebuilds cmd/memwall/memwall.pgo, the CPU profile the Go compiler uses to
# optimize the memwall binary (profile-guided optimization: hot calls are
# inlined and hot interface calls devirtualized; release builds pass it with
# `go build -pgo=cmd/memwall/memwall.pgo`, as scripts/gpu-build.sh does. It
# is not default.pgo, which `go test ./...` would build every dependency a
# second time with). The profile comes from memwall's own workloads on the
# simulated device: the allocation bench (the pool's fast and central
# paths), replays of both PyTorch traces, and the demo. Re-run it after
# large changes to the pool or the allocators, and commit the result.
set -euo pipefail
cd "$(dirname "$0")/.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
go build -pgo=off -o "$tmp/memwall" ./cmd/memwall
prof() { # prof NAME ARGS...: run memwall with a CPU profile
  local name=$1; shift
  echo "profiling: memwall $*" >&2
  MEMWALL_CPUPROFILE="$tmp/$name.pprof" "$tmp/memwall" "$@" >/dev/null
}
prof bench bench alloc --device sim --pairs 40000
prof bench1 bench alloc --device sim --pairs 100000 --goroutines 1
prof gpt2 replay testdata/traces/gpt2_medium_generate.csv.gz
prof bert replay testdata/traces/bert_base_varlen.csv.gz
prof demo demo
go tool pprof -proto "$tmp"/*.pprof >cmd/memwall/memwall.pgo 2>/dev/null
ls -l cmd/memwall/memwall.pgo
