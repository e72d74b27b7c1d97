package main

import (
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strings"
	"testing"

	"github.com/VictoriaMetrics/metrics"
)

func TestStampOf(t *testing.T) {
	vcs := func(rev, modified string) *debug.BuildInfo {
		return &debug.BuildInfo{GoVersion: "go1.99.1", Main: debug.Module{Path: "switchyard", Version: "(devel)"},
			Settings: []debug.BuildSetting{{Key: "vcs", Value: "git"}, {Key: "vcs.revision", Value: rev}, {Key: "vcs.modified", Value: modified}}}
	}
	tests := []struct {
		name                string
		linkVer, linkCommit string
		bi                  *debug.BuildInfo
		want                buildStamp
	}{
		{"linked values win", "v1.2.3-4-gabcdef0", "abcdef0123", vcs("ffff", "true"),
			buildStamp{Version: "v1.2.3-4-gabcdef0", Commit: "abcdef0123", GoVersion: "go1.99.1"}},
		{"vcs fallback", "", "", vcs("0123456789abcdef", "false"),
			buildStamp{Version: "devel", Commit: "0123456789abcdef", GoVersion: "go1.99.1"}},
		{"vcs fallback, modified tree", "", "", vcs("0123456789abcdef", "true"),
			buildStamp{Version: "devel", Commit: "0123456789abcdef", Modified: true, GoVersion: "go1.99.1"}},
		{"module version from go install", "", "", &debug.BuildInfo{GoVersion: "go1.99.1", Main: debug.Module{Version: "v0.4.0"}},
			buildStamp{Version: "v0.4.0", Commit: "unknown", GoVersion: "go1.99.1"}},
		{"nothing recorded", "", "", nil,
			buildStamp{Version: "devel", Commit: "unknown", GoVersion: runtime.Version()}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := stampOf(tt.linkVer, tt.linkCommit, tt.bi)
			tt.want.Platform = runtime.GOOS + "/" + runtime.GOARCH
			if got != tt.want {
				t.Fatalf("got %+v, want %+v", got, tt.want)
			}
		})
	}
}

func TestVersionCommand(t *testing.T) {
	for _, args := range [][]string{{"version"}, {"--version"}} {
		code, out, errOut := runCmd(t, args...)
		if code != 0 {
			t.Fatalf("%v: exit %d: %s", args, code, errOut)
		}
		lines := strings.Split(strings.TrimSpace(out), "\n")
		if len(lines) != 4 || !strings.HasPrefix(lines[0], "switchyard ") || !strings.HasPrefix(lines[1], "commit:") ||
			lines[2] != "go:       "+runtime.Version() || lines[3] != "platform: "+runtime.GOOS+"/"+runtime.GOARCH {
			t.Fatalf("%v printed:\n%s", args, out)
		}
	}
	if code, _, errOut := runCmd(t, "version", "extra"); code == 0 || !strings.Contains(errOut, "extra") {
		t.Fatalf("version extra: exit %d, %q", code, errOut)
	}
}

func TestBuildInfoMetric(t *testing.T) {
	set := metrics.NewSet()
	buildStamp{Version: `v1.0.0"evil\`, Commit: "abc", Modified: true, GoVersion: "go1.26.0"}.registerBuildInfo(set)
	var b strings.Builder
	set.WritePrometheus(&b)
	want := `switchyard_build_info{version="v1.0.0_evil_",revision="abc-modified",goversion="go1.26.0"} 1`
	if !strings.Contains(b.String(), want) {
		t.Fatalf("exported:\n%s\nwant the line %s", b.String(), want)
	}
}

// TestVersionStampLinked builds the binary with the linker flags make release passes and runs
// `switchyard version`: a renamed variable would make the linker drop the stamp silently.
// (Without make release's -trimpath and CGO_ENABLED=0, so that the build reuses the test's
// cached packages and only links.)
func TestVersionStampLinked(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go tool on PATH")
	}
	bin := filepath.Join(t.TempDir(), "switchyard")
	build := exec.Command(goTool, "build", "-o", bin,
		"-ldflags", "-s -w -X main.version=v9.8.7-test -X main.commit=0123456789abcdef0123456789abcdef01234567", ".")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	out, err := exec.Command(bin, "version").CombinedOutput()
	if err != nil {
		t.Fatalf("switchyard version: %v\n%s", err, out)
	}
	for _, want := range []string{"switchyard v9.8.7-test\n", "commit:   0123456789abcdef0123456789abcdef01234567\n", "go:       go"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("switchyard version printed:\n%s\nwant %q", out, want)
		}
	}
}
