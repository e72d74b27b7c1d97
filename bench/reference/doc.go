// Package reference runs the proxies the router's serving path is measured against, in
// the same run and on the same engines: a bare fasthttp reverse proxy (round robin, the
// request and answer copied through, streams relayed as they come, nothing parsed; in this
// process with StartBare, as its own process with StartBareProcess, which runs a command
// serving BareCommand: switchyard bare-proxy) and nginx (StartNginx: the reverse proxy users compare against, started from
// the nginx binary with a configuration generated for the run).
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
// each in its own process group, SIGTERM then SIGKILL on Close) until Close,
// which stops them and waits for them, and removes nginx's directory. Close every Proxy.
package reference
