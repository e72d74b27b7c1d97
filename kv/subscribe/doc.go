// Package subscribe feeds an index.Index from the engines' KV events.
//
// Manager runs the subscriptions to the engines' ZMQ publishers in both topologies of
// INTEROP.md: connect to each engine's PUB per DP rank (configured, named by the router's
// worker lifecycle, or found by a Discoverer), or bind a SUB that vLLM-style engines dial,
// identified by topic (kv@host:port+rank@model). It tracks each publisher's sequence,
// replays a gap (both reply layouts), reconnects with backoff (zmtp.Retry), and clears an
// owner on restart, reconnection without replay or removal. Every socket goes through
// load/zmtp: a peer past ManagerConfig.Limits is hung up on and counted; malformed batches
// are logged once per publisher and interval. It neither fetches nor decodes /server_info:
// httpfront/fleet owns the one introspection of an engine.
//
// The applier (apply.go) keys a worker's events by the engine's hashes once a first block
// without a parent proves them to be the router's (or WorkerSpec.HashScheme declares it),
// and otherwise re-keys them from their token IDs (vLLM-style engines) to the SHA-256 chain;
// on an index keyed by the router's own keys (index.BlockKeyRouter) it re-keys every engine's
// blocks to them. Either way it maps the engine's hashes to the keys (or digests) per owner
// (at most 2M blocks each; keytable.go, an open-addressing table whose lines a batch's events
// load ahead, growing a few entries a put). Once a worker's
// hashes are the router's, its batches (on a per-rank subscription or an Ingestor) are decoded
// without their token IDs (events.Decoder.SkipTokenIDs). Ingestor applies raw payloads
// without a transport.
//
// Concurrency: Manager is safe for concurrent use; cancel the context of Manager.Run and wait
// for it (it closes every socket it opened). An Ingestor belongs to one goroutine.
package subscribe
