// Package actors hosts Switchyard's selection state on Proto.Actor actors: bucket actors and
// their group actors (Selector), the telemetry actor (Telemetry), affinity scope actors
// (AffinityStore) and prefix-index shard actors (IndexShards). The selection rules themselves live in
// package engine; this package only decides which goroutine runs them and how requests
// reach it.
//
// # What it owns
//
//   - Selector: one bucket actor per engine.Bucket and, as its children, one group actor per
//     engine.EngineGroup. The group actor is the only goroutine that calls its group's Pick,
//     so the group's candidate cache and the policy's state (round-robin cursor, random
//     source) need no locks. Group actors read the worker registry (engine.WorkerSet) and
//     the load table as immutable snapshots on every pick, so health and load changes are
//     seen by the next pick.
//   - Telemetry: one telemetry actor owning a load.Aggregator. Transports (load.Poller for
//     HTTP: native routes, the Prometheus page, or detection, chosen per worker by its
//     flavour and load.source; load.GaugeSubscriber for the ZMQ load gauge) send it
//     LoadReported events; it rebuilds the load.Table snapshot at most once per publish
//     interval when something changed, and at least once per refresh interval.
//     Telemetry.Status says which source each worker's load comes from.
//   - System: the process's one Proto.Actor system. Every component above runs on it (a
//     component built without one makes a private System), with the one bounded mailbox
//     implementation (plugged in through Proto.Actor's mailbox hook) and one Counters of
//     mailbox rejections and recovered panics per Kind, registered as
//     switchyard_actor_mailbox_rejections_total{kind} and switchyard_actor_panics_total{kind}.
//     SystemOptions.Observe is the test seam that runs before each command.
//   - call: the one request/reply type (reply channel with the deadline answering on it,
//     abandoned flag), embedded in the pooled command structs of every component.
//   - Cluster (cluster.enabled): remote and cluster on the System, the affinity partition
//     grains (an engine.AffinityStore shared by every replica), binding hand-off on a
//     graceful leave, the near cache of bindings read from other owners (kept correct by a
//     generation per partition the owners' invalidations and owner changes bump), and the
//     gossip of per-worker counters and worker changes. Its messages are protobuf (package
//     clusterpb), Proto.Actor remote's wire format.
//
// # Concurrency model
//
// A pick is one round trip: the request goroutine sends a pooled call (PickEngines) to the
// bucket actor; the bucket actor forwards it (PickEngine) to the plain group actor, or to
// the prefill group actor, which forwards it to the decode group actor after picking (the
// decode group picks among the engines compatible with that prefill engine,
// engine.EngineGroup.PickFor; with a PD bucket's bypass on, the decode group actor picks
// first and either completes the request alone or forwards it to the prefill group actor);
// the last actor writes the result into the call and signals the call's reply channel.
// Selector.Select orders the compatible buckets in the request goroutine before the first
// round trip (engine.BucketResolver.Order: the slo rule reads only snapshots and atomics),
// and records the rule in the selection. The
// caller waits on that channel alone; a timer armed for the pick deadline
// (actors.pick_timeout) answers on the same channel, so a stuck actor costs the caller
// OutcomeTimeout, never a hang. No future, no per-pick allocation.
//
// Actors never block on I/O: anything that waits on the network (tokenization, remote
// prefix lookups) happens in the request goroutine before the pick is sent.
//
// Mailboxes are bounded (actors.mailbox.<kind>) and never block the sender: a full mailbox
// answers a command at once with engine.OutcomeOverloaded (HTTP 429 at the front end) and
// counts it; an event that finds the mailbox full (a load report) is dropped and counted,
// as the next report supersedes it. Each mailbox runs one goroutine for its actor's
// lifetime, parked on a channel receive between messages; Proto.Actor's dispatcher is not
// used.
//
// Supervision: a panic in an actor (in practice, in a policy) is recovered in Receive, the
// request that hit it is answered with engine.OutcomeInternal (ErrPanicked), the panic is
// logged and counted, and the actor is restarted by Proto.Actor (always, however often it
// fails). The engine group and its policy instance survive the restart; other requests
// queued in the mailbox are served after it. Proto.Actor's own logging goes to the injected
// slog.Logger (attribute lib=protoactor); its metrics provider is not used.
//
// # What a caller must release
//
//   - Selector.Close and Telemetry.Close stop every actor, transport and ticker they started
//     and wait for them. Picks after Close fail with OutcomeInternal (ErrClosed).
//   - Errors returned by a pick may be shared between requests (per-bucket overload errors):
//     do not modify them.
//   - After a pick returns OutcomeTimeout, an actor may still read the request: do not reuse
//     or mutate that *engine.BucketRequest (let it be collected). Any other outcome returns
//     only after every actor is done with it.
//   - A LoadReported event transfers its Reports slice to the telemetry actor.
package actors
