package main

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"runtime"
	"runtime/debug"

	"github.com/memwall/memwall/kernels"
)

func init() {
	register(verb{name: "version", summary: "print memwall's version, commit, Go version and the embedded kernels' hashes", run: runVersion})
}

// buildCommit and buildModified are set by the linker where the toolchain
// cannot stamp the commit (a linked git worktree, -buildvcs=false):
// -ldflags "-X main.buildCommit=$(git rev-parse HEAD) -X main.buildModified=true",
// as scripts/gpu-build.sh does. The toolchain's stamp wins when there is one.
var buildCommit, buildModified string

// ptxJSON is one embedded PTX build in `memwall version --json`.
type ptxJSON struct {
	Target string `json:"target"`
	Bytes  int    `json:"bytes"`
	SHA256 string `json:"sha256"`
	// SourceSHA256 is the hash of the kernels.cu the PTX was built from, as
	// the build recorded it in the file; null when it did not.
	SourceSHA256 *string `json:"source_sha256"`
}

// versionJSON is `memwall version --json`. Fields the binary does not know
// (a build that recorded no commit) are null.
type versionJSON struct {
	Module     string  `json:"module"`
	Version    string  `json:"version"`
	Commit     *string `json:"commit"`
	CommitTime *string `json:"commit_time"`
	Modified   *bool   `json:"modified"`
	// CommitFrom says who recorded the commit: "toolchain" (vcs.* build
	// settings) or "linker flag" (main.buildCommit); null with no commit.
	CommitFrom *string   `json:"commit_from"`
	Go         string    `json:"go"`
	OS         string    `json:"os"`
	Arch       string    `json:"arch"`
	PTX        []ptxJSON `json:"ptx"`
}

// buildVersion reads what the Go toolchain recorded in the binary
// (runtime/debug.ReadBuildInfo: the module's version and the vcs.*
// settings) and hashes the embedded PTX.
func buildVersion() versionJSON {
	v := versionJSON{Module: "github.com/memwall/memwall", Version: "(unknown)", Go: runtime.Version(), OS: runtime.GOOS, Arch: runtime.GOARCH}
	if bi, ok := debug.ReadBuildInfo(); ok {
		if bi.Main.Path != "" {
			v.Module = bi.Main.Path
		}
		if bi.Main.Version != "" {
			v.Version = bi.Main.Version
		}
		for _, s := range bi.Settings {
			val := s.Value
			switch s.Key {
			case "vcs.revision":
				v.Commit = &val
			case "vcs.time":
				v.CommitTime = &val
			case "vcs.modified":
				m := val == "true"
				v.Modified = &m
			}
		}
	}
	from := "toolchain"
	if v.Commit == nil && buildCommit != "" {
		c := buildCommit
		v.Commit, from = &c, "linker flag"
		if buildModified != "" {
			m := buildModified == "true"
			v.Modified = &m
		}
	}
	if v.Commit != nil {
		v.CommitFrom = &from
	}
	for _, t := range kernels.Targets() {
		b := kernels.EmbeddedFor(t)
		sum := sha256.Sum256(b)
		p := ptxJSON{Target: t, Bytes: len(b), SHA256: hex.EncodeToString(sum[:])}
		if h, ok := kernels.PTXSourceHash(b); ok {
			p.SourceSHA256 = &h
		}
		v.PTX = append(v.PTX, p)
	}
	return v
}

func runVersion(e *env, args []string) error {
	fs := newFlags(e, "version", "[--json]")
	asJSON := fs.Bool("json", false, "print JSON")
	if err := parseNoArgs(fs, args); err != nil {
		return err
	}
	v := buildVersion()
	if *asJSON {
		return writeJSON(e.stdout, v)
	}
	w := e.stdout
	fmt.Fprintf(w, "memwall  %s %s\n", v.Module, v.Version)
	fmt.Fprintf(w, "commit   %s\n", commitLine(v))
	fmt.Fprintf(w, "go       %s %s/%s\n", v.Go, v.OS, v.Arch)
	for _, p := range v.PTX {
		src := "source hash not recorded"
		if p.SourceSHA256 != nil {
			src = "from kernels.cu sha256 " + short(*p.SourceSHA256)
		}
		fmt.Fprintf(w, "kernels  %s PTX sha256 %s (%d bytes), %s\n", p.Target, short(p.SHA256), p.Bytes, src)
	}
	return nil
}

// commitLine says which commit the binary was built from, or that the
// build recorded none and how to get a build that does: the Go toolchain
// stamps the commit only when go build or go install builds the main
// package in a git checkout's own directory (go run and go test never do,
// nor a build in a linked worktree, whose .git is a file).
func commitLine(v versionJSON) string {
	if v.Commit == nil {
		return "not recorded in this build (go run and go test record none, nor go build with -buildvcs=false, outside a git checkout or in a linked worktree); " +
			"go build in the checkout records it, or pass it: go build -ldflags \"-X main.buildCommit=$(git rev-parse HEAD)\" ./cmd/memwall"
	}
	s := *v.Commit
	if v.CommitTime != nil {
		s += " (" + *v.CommitTime + ")"
	}
	if v.Modified != nil && *v.Modified {
		s += ", with uncommitted changes"
	}
	if v.CommitFrom != nil && *v.CommitFrom != "toolchain" {
		s += " (from the " + *v.CommitFrom + ")"
	}
	return s
}

// short is the first 16 hex digits of a hash, enough to tell builds apart.
func short(h string) string {
	if len(h) > 16 {
		return h[:16]
	}
	return h
}
