// Package flow is the admission of requests to the router, ahead of engine selection: the
// token-bucket rate limits (router wide and per API key) and the concurrency limits with
// their bounded queues (router wide and per model). httpfront asks it at the entry of every
// inference route; a request it refuses never reaches a bucket.
//
// # What it owns
//
//   - Limiter: one concurrency limit and its queue. Under the limit a request takes a slot at
//     once; over it, it waits for a slot (by priority, then tenant fair share), until its
//     deadline (ErrQueueTimeout, HTTP 408), until its client leaves (ErrClientGone: it is taken out of the queue), or
//     until the router stops (ErrStopped). A full queue refuses at once (ErrQueueFull, 429).
//     A slot is held until Release, which hands it straight to the next waiter (see below).
//   - TokenBucket: one rate limit (GCRA: the bucket is one atomic timestamp). KeyLimiter: one
//     TokenBucket per key in a bounded, sharded table that forgets the least recently used
//     keys (CLOCK), and first the keys whose bucket has refilled, whose forgetting loses
//     nothing.
//   - Gate: the limits of one router built from its configuration, their metrics, and the
//     Ticket a request holds for its slots.
//
// # Concurrency model
//
// Everything is safe for concurrent use. The fast path (under every limit, nobody queued)
// takes no lock: one compare-and-swap per limit and per rate bucket. A Limiter's mutex guards
// only its queue and is taken only when a request may queue (the limit reached, the queue
// not full) or by a Release that finds someone waiting; a request refused because the limit
// has no queue or its queue is full is refused without it. A per-key lookup of a key in the
// table takes no lock either (its shard is an open-addressing table of atomic pointers); a
// key not seen before takes its shard's lock to be added. Waiting for a slot is a select on
// the grant, a timer, and the caller's cancel channels; the caller supplies those (httpfront
// watches the client's connection), so this package knows nothing of HTTP.
//
// # Priorities and fair sharing
//
// A queued request carries a Class: its priority and its tenant. A Limiter's queue
// (classQueue) keeps one level per priority and serves the highest non-empty level first;
// within a level each tenant has its own FIFO, and tenants are served by start-time fair
// queueing weighted by server.tenant_weights, so one tenant's backlog cannot hold back
// another tenant's requests beyond their fair share. The fast path never looks at the class.
// Gate counts every admitted or refused request, and the queue wait of those that waited,
// per priority and tenant (switchyard_queue_class_*; tenants not named in the configuration
// share the label "other", and API keys never become labels).
//
// # What a caller must release
//
// A successful Acquire (Limiter) or Admit (Gate) holds slots until Release; release exactly
// once, when the request has finished (for a stream, when the relay ends). Nothing else needs
// releasing: a Gate has no goroutines.
package flow
