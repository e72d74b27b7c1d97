// Package actors hosts Switchyard's selection state on Proto.Actor actors: bucket actors and
// their group actors (Selector), the telemetry actor (Telemetry), affinity scope actors
// (AffinityStore), prefix-index and approximate-tree shard actors (IndexShards,
// ApproxShards), and with cluster.enabled the cluster (affinity partition grains, binding
// hand-off, a near cache of bindings read from other owners, gossip).
// The selection rules live in package engine; this package decides which goroutine runs
// them and how requests reach it. System is the process's one actor system, with the one
// bounded mailbox and one Counters of mailbox rejections and recovered panics per Kind;
// call is the one request/reply type. docs/architecture.md ("Actors") has the table.
//
// Concurrency: Selector.Select runs the bucket loop (engine.BucketLoop) in the request
// goroutine. Fast path, for a bucket whose actors have nothing queued and whose groups no
// goroutine is using: the request goroutine takes each group's run (a try-lock it never waits
// on) and makes the selection itself, the same steps the group actors make, with no message,
// goroutine hand-off or timer; one request at a time this saves three goroutine wake-ups
// per pick. Slow path, and always for PickEngines: one round trip; it sends a pooled call to
// the bucket actor, which hands it to the group actor of the bucket's first stage; each
// group actor takes its group's run, makes its step (engine.Bucket.PickStage, the one place
// a PD pair's order, bypass and compatibility live) and forwards the call to the next
// stage's group actor or answers it. Either way one goroutine at a time uses a group, so the
// policy's state needs no locks of its own; picks read the worker registry and load table as
// snapshots. The caller waits on the call's channel alone; a timer armed for
// actors.pick_timeout answers on the same channel, so a stuck actor costs OutcomeTimeout,
// never a hang. No future, no per-pick allocation.
// Actors never block on I/O. Mailboxes are bounded and never block the sender: a full one
// answers a command at once with engine.OutcomeOverloaded and counts it, and drops an event
// (a load report) and counts it.
//
// Supervision: a panic in an actor is recovered, the request that hit it is answered with
// engine.OutcomeInternal (ErrPanicked), logged and counted, and the actor restarted (its
// group and policy survive).
//
// What a caller must release: Selector.Close and Telemetry.Close stop every actor they
// started and wait for them (picks after Close fail with ErrClosed). Errors returned by a
// pick may be shared: do not modify them. After OutcomeTimeout an actor may still read the
// request: do not reuse that *engine.BucketRequest. A LoadReported event transfers its
// Reports slice to the telemetry actor.
package actors
