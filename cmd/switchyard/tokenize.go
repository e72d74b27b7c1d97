package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"

	"switchyard/httpfront"
	"switchyard/tokenizer/hf"
)

// maxTokenizeInput bounds what tokenize reads from stdin, as the router bounds request bodies.
const maxTokenizeInput = 32 << 20

// runTokenize prints the token IDs the router computes for the text (or, with --chat, the
// JSON array of OpenAI messages) on stdin, as a JSON array.
func runTokenize(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	return tokenize(ctx, args, os.Stdin, stdout, stderr)
}

func tokenize(_ context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("tokenize", flag.ContinueOnError)
	fs.SetOutput(stderr)
	path := fs.String("tokenizer", "", "tokenizer directory (tokenizer.json, tokenizer_config.json) or tokenizer.json file (required)")
	chat := fs.Bool("chat", false, "stdin is a JSON array of OpenAI chat messages: apply the chat template with the generation prompt")
	render := fs.Bool("render", false, "with --chat, print the rendered prompt text instead of the IDs")
	noSpecial := fs.Bool("no-special", false, "without --chat, do not add the post-processor's special tokens (add_special_tokens=False)")
	setUsage(fs, "usage: switchyard tokenize --tokenizer PATH [--chat [--render]] [--no-special] < input",
		"Prints the token IDs of stdin as a JSON array, exactly as the router counts and hashes them.")
	if err := fs.Parse(args); err != nil {
		return err
	}
	switch {
	case *path == "":
		fs.Usage()
		return errors.New("--tokenizer is required")
	case fs.NArg() > 0:
		return fmt.Errorf("unexpected arguments %q (the input is read from stdin)", fs.Args())
	case *render && !*chat:
		return errors.New("--render needs --chat")
	case *noSpecial && *chat:
		return errors.New("--no-special does not apply to --chat (a rendered conversation never gets post-processor tokens)")
	}
	tk, err := hf.Load(*path, hf.Options{CacheBytes: -1})
	if err != nil {
		return err
	}
	input, err := io.ReadAll(io.LimitReader(stdin, maxTokenizeInput+1))
	if err != nil {
		return fmt.Errorf("cannot read stdin: %w", err)
	}
	if len(input) > maxTokenizeInput {
		return fmt.Errorf("cannot read stdin: more than %d bytes", maxTokenizeInput)
	}
	var ids []uint32
	switch {
	case *chat:
		// The router's own rendering: messages prepared as the engine prepares them.
		body := append(append([]byte(`{"model":"tokenize","messages":`), input...), '}')
		prompt, chatIDs, err := httpfront.RenderChat(tk, body)
		if err != nil {
			return err
		}
		if *render {
			_, err = io.WriteString(stdout, prompt)
			return err
		}
		ids = chatIDs
	case *noSpecial:
		ids = tk.EncodePlain(string(input))
	default:
		ids = tk.Encode(string(input))
	}
	if ids == nil {
		ids = []uint32{}
	}
	out, err := json.Marshal(ids)
	if err != nil {
		return fmt.Errorf("cannot encode IDs: %w", err)
	}
	_, err = fmt.Fprintf(stdout, "%s\n", out)
	return err
}
