// Command switchyard is the Switchyard LLM inference router and its tools, in one binary:
//
//	serve       the router (the default command)
//	check       validate a configuration and print every problem
//	demo        mock engines plus the router: a short routing comparison, table and chart
//	bench       the benchmark harness (overhead, routing, pd, buckets, mailbox scenarios)
//	dispatch-demo  mock engines plus the router, a burst of requests, where each went
//	select      the selection core's picks on a built-in example, without engines
//	mockengine  simulated SGLang engines for tests and benchmarks
//	bare-proxy  the benchmarks' reference: a bare fasthttp reverse proxy
//	evloop-proxy  a benchmarks' reference (Linux): an epoll event-loop proxy on one OS thread
//	indexer     the prefix index as a network service shared by several routers
//	tokenize    the token IDs the router computes for stdin
//	version     the version, commit and Go version the binary was built with
//
// Release builds stamp the version and commit through the linker (-ldflags "-X main.version=…
// -X main.commit=…", make release); a binary built without them reports what the Go toolchain
// recorded (module version, vcs.revision). `switchyard version` prints the stamp and serve
// exports it as switchyard_build_info.
//
// main stays thin: each subcommand parses its flags, loads and validates its configuration,
// builds its component and runs it until the signal context is cancelled.
package main
