// Package retry holds the rules of Switchyard's dispatch retries, without any HTTP: which
// failures are retried (Policy.Retryable), how long to wait before each retry (Policy.Backoff:
// exponential with a multiplier, capped, with jitter from an injected random source), how many
// retries one request may make (Policy.MaxRetries), and the retry budget shared by every
// request (Budget: retries over a sliding window may number at most a ratio of the window's
// requests plus a minimum allowance), which stops retry storms when the whole fleet fails.
//
// The attempt loop that uses them is httpfront's (attempts.go): a dispatch that failed
// before any response byte reached the client is classified (Failure) and checked against
// the policy, its failed engines are excluded from the request
// (engine.BucketRequest.RetryAfter, which makes the next pick run in the same bucket first
// without them), and once that pick has found engines the budget is asked and the backoff
// waited. Where selection happens and which bucket comes next is the engine's rule, not
// this package's.
//
// # Concurrency
//
// A Policy is immutable after New and safe for concurrent use; its random source must be too
// (the default, math/rand/v2's top-level Float64, is). A Budget is safe for concurrent use and
// lock-free: each window slot holds two atomic counters that carry the slot's epoch in their
// upper bits, so counting a request is one compare-and-swap on the fast path and no request
// takes a mutex. Budget methods take the time as an argument (the request's own clock read),
// so tests drive them with any clock. Nothing needs releasing.
package retry
