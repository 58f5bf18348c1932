#!/usr/bin/env bash
# Builds everything the GPU run needs, on a machine with Go and no GPU:
# the memwall binary and the test binaries of the packages that have GPU
# tests, all with CGO_ENABLED=0 (libcuda is bound at run time). Output goes
# to gpubin/ (git-ignored); scripts/gpu-run.sh runs it on the GPU machine.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${BIN:-gpubin}
rm -rf "$bin"
mkdir -p "$bin"
export CGO_ENABLED=0
# The commit, passed by the linker: the toolchain stamps none in a linked
# git worktree, and none with -buildvcs=false.
vcs=""
if commit=$(git rev-parse HEAD 2>/dev/null); then
  vcs="-X main.buildCommit=$commit"
  [ -z "$(git status --porcelain 2>/dev/null)" ] || vcs="$vcs -X main.buildModified=true"
fi
go build -pgo=cmd/memwall/memwall.pgo -ldflags="-s -w $vcs" -o "$bin/memwall" ./cmd/memwall
for pkg in device/cuda device/vulkan pool kernels plan/bind bench residency kvcache engine ${GPU_PKGS:-}; do
  [ -d "$pkg" ] || continue
  go test -c -ldflags="-s -w" -o "$bin/$(echo "$pkg" | tr / _).test" "./$pkg" || echo "skipped $pkg: does not build"
done
ls -la "$bin"
