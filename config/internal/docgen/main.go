// Command docgen writes the configuration reference, docs/config-reference.md, from the
// configuration schema: the keys and types of config.Config (koanf tags), the defaults of
// config.Default, the meanings and defaults stated in the field comments of config/*.go
// (read with go/ast), the units in `unit` struct tags, the environment variable rule and
// the flags of config.FlagKeys.
//
//	go run ./config/internal/docgen -o docs/config-reference.md   # make docs
//	go run ./config/internal/docgen -check docs/config-reference.md  # make docs-check
//
// A field comment must state its default ("Default 5s.", "Default: none.") or say that the
// key is required; where config.Default holds the key, the stated default must equal it.
// A key added to config.Config therefore needs only its comment (and, for a number, a
// `unit` tag) and a `make docs`.
package main

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
)

func main() {
	if err := run(os.Args[1:], os.Stdout, os.Stderr); err != nil {
		if !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(os.Stderr, "docgen:", err)
		}
		os.Exit(1)
	}
}

func run(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("docgen", flag.ContinueOnError)
	fs.SetOutput(stderr)
	dir := fs.String("config", "config", "`DIR` holding the config package's source")
	out := fs.String("o", "", "write the reference to `FILE` (default: standard output)")
	check := fs.String("check", "", "compare the reference with `FILE` and fail when they differ")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	docs, err := parseDocs(*dir)
	if err != nil {
		return err
	}
	page, err := generate(docs)
	if err != nil {
		return err
	}
	switch {
	case *check != "":
		have, err := os.ReadFile(*check)
		if err != nil {
			return fmt.Errorf("cannot read %s: %w", *check, err)
		}
		return compare(*check, have, page)
	case *out != "":
		if err := os.WriteFile(*out, page, 0o644); err != nil {
			return fmt.Errorf("cannot write %s: %w", *out, err)
		}
		return nil
	}
	_, err = stdout.Write(page)
	return err
}

// compare returns an error naming the first line where have differs from want.
func compare(name string, have, want []byte) error {
	if bytes.Equal(have, want) {
		return nil
	}
	h, w := bytes.Split(have, []byte("\n")), bytes.Split(want, []byte("\n"))
	i := 0
	for i < len(h) && i < len(w) && bytes.Equal(h[i], w[i]) {
		i++
	}
	line := func(ls [][]byte) string {
		if i < len(ls) {
			return string(ls[i])
		}
		return "(end of file)"
	}
	return fmt.Errorf("%s differs from the configuration schema at line %d; run `make docs`\n  committed: %s\n  generated: %s",
		name, i+1, line(h), line(w))
}
