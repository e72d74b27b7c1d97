package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"switchyard/config"
	"switchyard/httpfront/fleet"
)

// runCheck loads and validates a configuration and reads the TLS files it names, printing
// every problem on its own line.
func runCheck(_ context.Context, args []string, stdout, stderr io.Writer) error {
	cfg, err := config.Load(args, os.Environ())
	if errors.Is(err, flag.ErrHelp) {
		config.Usage(stdout)
		return err
	}
	if err == nil {
		err = cfg.Validate()
	}
	if err == nil {
		// The files of upstream.tls and workers[].tls, read as the router's start reads them.
		_, err = fleet.LoadTLS(cfg)
	}
	if err != nil {
		for _, line := range problems(err) {
			fmt.Fprintln(stderr, line)
		}
		return errReported
	}
	fmt.Fprintf(stdout, "configuration ok: %d workers, %d models\n", len(cfg.Workers), len(cfg.Models))
	return nil
}

// problems flattens joined errors into one line each.
func problems(err error) []string {
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		var out []string
		for _, e := range j.Unwrap() {
			out = append(out, problems(e)...)
		}
		return out
	}
	return strings.Split(err.Error(), "\n")
}
