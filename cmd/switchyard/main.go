package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"switchyard/bench/mockengine"
	"switchyard/bench/reference"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// command is one subcommand: it parses its own flags from args and runs until done or ctx is
// cancelled.
type command struct {
	name  string
	usage string
	run   func(ctx context.Context, args []string, stdout, stderr io.Writer) error
}

func commands() []command {
	return []command{
		{"serve", "run the router (the default command): switchyard [serve] --config FILE", runServe},
		{"check", "validate a configuration: switchyard check --config FILE", runCheck},
		{"demo", "mock engines and the router: a short routing comparison with a table and a chart", runBenchDemo},
		{"bench", "the benchmark harness: switchyard bench --scenario overhead|routing|pd|buckets|mailbox|all", runBench},
		{"dispatch-demo", "start mock engines and the router, send a burst of requests, print where each went", runServeDemo},
		{"select", "print the selection core's picks for the built-in example (no engines needed)", runSelect},
		{"mockengine", "run simulated SGLang engines: switchyard mockengine [--count N] (see --help)", mockengine.Command},
		{"bare-proxy", "the bench's reference, a bare fasthttp reverse proxy: switchyard bare-proxy --engines URL[,URL...]", reference.BareCommand},
		{"evloop-proxy", "a bench reference, an epoll event-loop reverse proxy on one OS thread (Linux): switchyard evloop-proxy --engines URL[,URL...]", reference.EvloopCommand},
		{"indexer", "serve the prefix index to several routers: switchyard indexer [--listen HOST:PORT] --config FILE", runIndexer},
		{"tokenize", "print the token IDs of stdin: switchyard tokenize --tokenizer PATH [--chat]", runTokenize},
		{"version", "print the version, commit, Go version and platform of this binary", runVersion},
	}
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	switch {
	case len(args) > 0 && (args[0] == "-h" || args[0] == "--help" || args[0] == "help"):
		usage(stdout)
		return 0
	case len(args) > 0 && args[0] == "--version":
		args = []string{"version"}
	case len(args) == 0 || strings.HasPrefix(args[0], "-"):
		args = append([]string{"serve"}, args...) // serve is the default command
	}
	for _, c := range commands() {
		if c.name != args[0] {
			continue
		}
		err := c.run(ctx, args[1:], stdout, stderr)
		switch {
		case err == nil:
			return 0
		case errors.Is(err, flag.ErrHelp):
			return 0
		case errors.Is(err, errReported):
			return 1
		default:
			fmt.Fprintf(stderr, "switchyard %s: %v\n", c.name, err)
			return 1
		}
	}
	fmt.Fprintf(stderr, "switchyard: unknown command %q\n\n", args[0])
	usage(stderr)
	return 2
}

// errReported means the command already printed its failure.
var errReported = errors.New("reported")

func usage(w io.Writer) {
	fmt.Fprintln(w, "usage: switchyard <command> [flags]\n\ncommands:")
	for _, c := range commands() {
		fmt.Fprintf(w, "  %-14s %s\n", c.name, c.usage)
	}
}

// setUsage makes fs's help (-h, or a flag error) what every command's help starts with: its
// usage line ("usage: switchyard NAME ..."), then what it does (when about is not empty), then
// its flags.
func setUsage(fs *flag.FlagSet, line, about string) {
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), line)
		if about != "" {
			fmt.Fprintln(fs.Output(), about)
		}
		fs.PrintDefaults()
	}
}
