// Package indexer serves an index.Index to other routers and queries one: `switchyard
// indexer`. Handler serves the index and its subscriptions over HTTP (PathMatch, plus
// health, status, workers and metrics); RemoteSource is the router's client, a kv.CacheSource
// with bounded in-flight queries and a deadline. The protocol (wire.go) is a compact binary
// query and answer (ContentTypeBinary) or JSON, with caps on the query's size, tokens and
// model name; decoding never panics and rejects what exceeds the caps.
//
// Handler and RemoteSource are safe for concurrent use; close the server that runs a
// Handler.
package indexer
