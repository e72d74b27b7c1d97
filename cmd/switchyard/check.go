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
	cfg, err := loadConfig(args, stdout, stderr, "check", "usage: switchyard check [--config FILE] [flags]")
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "configuration ok: %d workers, %d models\n", len(cfg.Workers), len(cfg.Models))
	return nil
}

// loadConfig is the one configuration load of check, serve and indexer: it loads args and the
// environment, validates the result and prints every problem on its own line to stderr
// (returning errReported), or the usage lines and config.Usage to stdout on --help (returning
// flag.ErrHelp). cmd is the command's name, for the usage line of --compat's help.
func loadConfig(args []string, stdout, stderr io.Writer, cmd string, usage ...string) (*config.Config, error) {
	cfg, err := config.Load(args, os.Environ())
	return checkLoaded(cfg, err, stdout, stderr, cmd, usage...)
}

// checkLoaded is loadConfig's second half, for a configuration loaded (cfg, err) by other
// means (serve's, which may first ask sgl-router's workers for their model). On --help
// after --compat sgl-router it prints sgl-router's flags instead of config.Usage.
func checkLoaded(cfg *config.Config, err error, stdout, stderr io.Writer, cmd string, usage ...string) (*config.Config, error) {
	if errors.Is(err, config.ErrCompatHelp) {
		fmt.Fprintln(stdout, "usage: switchyard "+cmd+" --compat "+config.CompatSGLRouter+" [sgl-router flags]")
		config.CompatUsage(stdout)
		return nil, err
	}
	if errors.Is(err, flag.ErrHelp) {
		for _, line := range usage {
			fmt.Fprintln(stdout, line)
		}
		config.Usage(stdout)
		return nil, err
	}
	if err == nil {
		err = cfg.Validate()
	}
	if err == nil {
		// The files of upstream.tls and workers[].tls, read as the router's start reads them.
		_, err = fleet.LoadTLS(cfg)
	}
	if err != nil {
		printProblems(stderr, err)
		return nil, errReported
	}
	return cfg, nil
}

// printProblems prints every problem of err (joined errors flattened) on its own line.
func printProblems(w io.Writer, err error) {
	for _, line := range problems(err) {
		fmt.Fprintln(w, line)
	}
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
