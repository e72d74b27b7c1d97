// Package reference runs the proxies the router's serving path is measured against, in
// the same run and on the same engines: a bare fasthttp reverse proxy (round robin, the
// request and answer copied through, streams relayed as they come, nothing parsed; in this
// process with StartBare, as its own process with StartBareProcess, which runs a command
// serving BareCommand: switchyard bare-proxy), an event-loop proxy (Linux: StartEvloop,
// StartEvloopProcess, EvloopCommand: switchyard evloop-proxy) and nginx (StartNginx: the
// reverse proxy users compare against, started from the nginx binary with a configuration
// generated for the run).
//
// # The event-loop proxy
//
// An HTTP/1.1 reverse proxy on one goroutine locked to its OS thread: an edge-triggered
// epoll set over the listener, the clients and the engine connections, nonblocking reads
// and writes as raw system calls, keep-alive connections both ways (idle engine
// connections pooled per engine, round robin), one request at a time per client
// connection (pipelined ones wait in its buffer), each engine read relayed to the client at
// once (a slow client pauses the engine's reads). Only the framing is parsed: the request
// head (bounded, 16 KiB) and its Content-Length body (8 MiB; chunked bodies get 501), the
// answer's head and its Content-Length or chunked body (the chunked framing followed by
// fleet.ChunkedFraming, the router's own decoder). A reused engine connection that
// drops a request unanswered has it resent once on a new one. No TLS, deadlines, selection
// or metrics: it measures what a Go process pays per request without Go's netpoller and
// scheduler. Its state is the loop goroutine's alone; Close wakes it through a pipe and
// waits for it to close every socket.
//
// # nginx
//
// StartNginx writes a configuration into a temporary directory (pid file, logs and temp
// paths there; no default path is touched): one worker process, an upstream block over the
// engines with keep-alive connections, HTTP/1.1 to the engines, proxy_buffering off (a
// stream is relayed as it arrives), no access log, unlimited keep-alive requests on both
// sides. The listening socket is opened here on 127.0.0.1 with a port chosen by the OS and
// handed to nginx as an inherited socket (the NGINX environment variable), so no port is
// guessed and clients may connect before nginx accepts. ErrNoNginx says the binary is
// missing (Debian package nginx or nginx-light); the caller decides whether that skips or
// fails.
//
// # CPU
//
// Proxy.ExternalCPU is the CPU time the proxy spent outside this process (nginx: its
// master and worker processes; the bare proxy process; from /proc on Linux); StartBare's
// proxy runs in this process, so its CPU is in the process's own.
//
// # Concurrency model and what a caller must release
//
// A Proxy serves on its own goroutines (StartBare) or processes (nginx, StartBareProcess;
// each in its own process group, SIGTERM then SIGKILL on Close; ProcessOptions lengthen
// the waits for a process run under valgrind) until Close,
// which stops them and waits for them, and removes nginx's directory. Close every Proxy.
package reference
