// Package jinja is an interpreter for the subset of Jinja that chat templates use, with the
// environment transformers builds for apply_chat_template, so that a template renders here
// byte for byte as Jinja2 renders it for the engine.
//
// # What it owns
//
//   - Compile and Template.Render. The environment: trim_blocks, lstrip_blocks, the loop
//     controls (break, continue), no autoescaping, default (lenient) undefined values, an
//     immutable sandbox (no method mutates a value), the globals raise_exception,
//     strftime_now, namespace, range, dict, and transformers' tojson filter (Python's
//     json.dumps: its key order, separators and ensure_ascii=False). Statements: if/elif/else,
//     for (with else, a filter condition and tuple targets), set (also as a block, and on
//     namespace attributes), macro, filter blocks, raw, generation (transformers'
//     tag, rendered as its body), break, continue. Values follow Python's semantics (see
//     eval.go): None, bool, int64, float64, str, list, tuple and Dict, a dict that keeps
//     insertion order.
//   - DecodeJSON, which turns JSON (a request's messages and tools) into those values as
//     Python's json.loads does, keys in order.
//
// Every rendering is bounded: loop iterations, output size, macro depth and range() lengths
// have fixed limits, so a template or its data cannot run away. Errors wrap ErrTemplate.
//
// Parity: testdata/jinja.json holds small templates rendered by Jinja2 3.1 configured as
// transformers configures it (tokenizer/hf/testdata/gen_chat.py); the real chat templates
// are checked by tokenizer/hf's chat parity tests.
//
// # Concurrency model
//
// A Template is immutable after Compile and may be rendered from any number of goroutines;
// a rendering uses only per-call state. A Dict is not safe for concurrent mutation; values
// passed to Render are only read.
//
// # What a caller must release
//
// Nothing.
package jinja
