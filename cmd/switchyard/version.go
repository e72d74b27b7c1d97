package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"runtime"
	"runtime/debug"
	"strings"

	"github.com/VictoriaMetrics/metrics"
)

// The release stamp, set by the linker (make release):
//
//	go build -ldflags "-X main.version=$(git describe --tags --always --dirty) -X main.commit=$(git rev-parse HEAD)"
//
// They are written only by the linker; nothing assigns them at run time.
var (
	version string
	commit  string
)

// buildStamp is what `switchyard version` prints and switchyard_build_info exports.
type buildStamp struct {
	Version   string // the linked version, else the module version, else "devel"
	Commit    string // the linked commit, else the VCS revision Go recorded, else "unknown"
	Modified  bool   // the VCS tree had local changes (only known without a linked commit)
	GoVersion string
	Platform  string // GOOS/GOARCH
}

// currentStamp is this binary's stamp.
func currentStamp() buildStamp {
	bi, _ := debug.ReadBuildInfo()
	return stampOf(version, commit, bi)
}

// stampOf resolves the stamp from the linked values, falling back on what the Go toolchain
// recorded in the binary (bi may be nil): `go install` and `go build` in a git checkout record
// vcs.revision and vcs.modified (unless -buildvcs=false), and a module version when the
// binary was installed as a module.
func stampOf(linkVersion, linkCommit string, bi *debug.BuildInfo) buildStamp {
	s := buildStamp{Version: linkVersion, Commit: linkCommit, GoVersion: runtime.Version(),
		Platform: runtime.GOOS + "/" + runtime.GOARCH}
	if bi != nil {
		if s.Version == "" && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
			s.Version = bi.Main.Version
		}
		if bi.GoVersion != "" {
			s.GoVersion = bi.GoVersion
		}
		if s.Commit == "" {
			for _, kv := range bi.Settings {
				switch kv.Key {
				case "vcs.revision":
					s.Commit = kv.Value
				case "vcs.modified":
					s.Modified = kv.Value == "true"
				}
			}
		}
	}
	if s.Version == "" {
		s.Version = "devel"
	}
	if s.Commit == "" {
		s.Commit = "unknown"
		s.Modified = false
	}
	return s
}

// write prints the stamp, one fact per line.
func (s buildStamp) write(w io.Writer) {
	commit := s.Commit
	if s.Modified {
		commit += " (modified)"
	}
	fmt.Fprintf(w, "switchyard %s\ncommit:   %s\ngo:       %s\nplatform: %s\n", s.Version, commit, s.GoVersion, s.Platform)
}

// registerBuildInfo exports the stamp as switchyard_build_info{version,revision,goversion} 1,
// the usual Prometheus info metric, so a dashboard can tell which build each replica runs.
func (s buildStamp) registerBuildInfo(set *metrics.Set) {
	revision := s.Commit
	if s.Modified {
		revision += "-modified"
	}
	name := `switchyard_build_info{version="` + labelSafe(s.Version) + `",revision="` + labelSafe(revision) +
		`",goversion="` + labelSafe(s.GoVersion) + `"}`
	set.NewGauge(name, func() float64 { return 1 })
}

// labelSafe keeps a stamp value to characters that need no escaping in a label value (a
// linked version comes from outside: git describe, a build script).
func labelSafe(v string) string {
	return strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', strings.ContainsRune(".-+_:/~", r):
			return r
		}
		return '_'
	}, v)
}

// runVersion is the version subcommand.
func runVersion(_ context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("version", flag.ContinueOnError)
	fs.SetOutput(stderr)
	setUsage(fs, "usage: switchyard version", "")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	currentStamp().write(stdout)
	return nil
}
