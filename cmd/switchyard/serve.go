package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"

	"switchyard/config"
	"switchyard/httpfront"
)

// runServe is the serve subcommand: it loads and validates the configuration, builds the
// front end and serves until ctx is cancelled (SIGINT/SIGTERM), then drains gracefully.
func runServe(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	cfg, err := config.Load(args, os.Environ())
	if errors.Is(err, flag.ErrHelp) {
		fmt.Fprintln(stdout, "usage: switchyard serve [--config FILE] [flags]")
		config.Usage(stdout)
		return err
	}
	if err == nil {
		err = cfg.Validate()
	}
	if err != nil {
		for _, line := range problems(err) {
			fmt.Fprintln(stderr, line)
		}
		return errReported
	}
	logger := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: logLevel(cfg.Log.Level)}))
	srv, err := httpfront.New(cfg, httpfront.Options{Logger: logger})
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "switchyard serving on http://%s\n", srv.Addr())
	return srv.Run(ctx)
}

func logLevel(s string) slog.Level {
	switch s {
	case config.LogLevelDebug:
		return slog.LevelDebug
	case config.LogLevelWarn:
		return slog.LevelWarn
	case config.LogLevelError:
		return slog.LevelError
	}
	return slog.LevelInfo
}
