package config

import "time"

// Abort configures how the router stops an engine's work on a request nobody waits for any
// more (the "abort" section): the client left (before or during the answer), or a router
// timeout fired (server.request_timeout, server.stream_idle_timeout,
// upstream.response_header_timeout). The router closes the connection of the dispatch,
// which stops an engine that aborts on a closed connection (vLLM), and asks an engine with
// an abort API (SGLang: POST /abort_request with the request's rid, which the router sets
// when the client did not) to abort it.
type Abort struct {
	// Enabled turns aborts on; off, a request whose client left runs to its end on the
	// engine, as before. Default true.
	Enabled bool `koanf:"enabled" json:"enabled"`
	// PrefillToCompletion lets a prefill/decode request's prefill run to completion when the
	// request is aborted (only its decode is stopped); false stops both. Default false.
	PrefillToCompletion bool `koanf:"prefill_to_completion" json:"prefill_to_completion"`
	// Timeout bounds one call of an engine's abort API. Default 2s.
	Timeout time.Duration `koanf:"timeout" json:"timeout"`
}

func defaultAbort() Abort { return Abort{Enabled: true, Timeout: 2 * time.Second} }

func (c *Config) validateAbort(p *problems) {
	positive(p, "abort.timeout", c.Abort.Timeout)
}
