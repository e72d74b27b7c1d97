// Package fleet is the router's worker lifecycle: where workers come from (the
// configuration, the admin API, Kubernetes pods), and for each worker its registry entry,
// its one introspection, active health checks, circuit breaker, upstream HTTP client,
// telemetry and KV-event subscriptions.
//
// # What it owns
//
//   - Introspection: Introspect fetches /server_info (then /get_server_info) with the one
//     bounded GET (load.Fetch) and DecodeInfo is the router's one decoder of it, lenient where
//     engines differ. Its Info feeds the registry (model, role, bootstrap port, DP size, and
//     the PD compatibility labels, which configured ones override), the telemetry (DP size,
//     load-gauge endpoints) and the KV subscriptions (publishers, block size); every wildcard
//     endpoint host is resolved by subscribe.EndpointHost. KVDiscoverer serves
//     the same introspection to `switchyard indexer` (subscribe.Discoverer).
//   - LoRA adapters (Options.AdapterRefresh, lora.enabled): the same loop asks the engine's
//     /v1/models every lora.refresh_interval (DecodeModelList, the one decoder of it) and
//     publishes the adapters it holds, with its slots, on its engine.Worker.
//   - Health: one loop per worker asks /health every health.interval; failure and success
//     thresholds move the verdict. A check that failed for a reason of the router's own (no
//     connection slot, no file descriptor) gives no verdict.
//   - Breaker: one per worker, lock-free (atomics). Consecutive failures the engine is
//     answerable for (no connection, timeouts, 502/503/504, broken streams) open it; other
//     5xx answers count only in an error rate over a window with a minimum volume; 4xx and
//     the router's own failures never count. Open, a timer turns it half-open when the
//     cool-down ends, and half-open it admits one probe at a time (Member.Admit).
//   - Upstream: each worker's HTTP client (Upstream): connections opened within
//     upstream.connect_timeout (TLS for https:// workers, with the authorities, client
//     certificate and server name of upstream.tls or the worker's own tls, read by
//     LoadTLS; never a byte of HTTP in clear text to such a worker), an idle lifetime below the
//     engines' keep-alive (upstream.max_idle_conn_duration), a deadline on the response
//     headers (upstream.response_header_timeout), a pool capped at
//     upstream.max_conns_per_worker that fails at once when full. A request that fails on a
//     reused connection before any byte of the answer is sent again once on a fresh one.
//     Deadlines move lazily on the socket (LazyDeadline, below TLS): a request's later
//     deadline is only recorded until the armed one fires, so a busy connection arms about
//     one deadline per timeout period, not several per request; the router's client
//     connections move theirs through the same LazyDeadline.
//     Failures are *Error values whose Kind says whether the engine or the router is
//     answerable; the router's own are counted in switchyard_router_errors_total and never
//     charged to the engine. A TLS failure says whether the engine's certificate was not
//     trusted or the engine asked for a client certificate the router does not have.
//   - Kubernetes discovery (Kubernetes): one client-go informer lists and watches the pods
//     the role selectors of discovery.kubernetes choose (a REST client that knows only the
//     core/v1 types, from a kubeconfig or the in-cluster service account); a pod becomes a
//     worker of its role while it is Running and Ready, named "<pod>.<namespace>", its URL
//     from the pod IP and the configured or named container port, its model from a label
//     or introspection, its bootstrap port from an annotation. Its workers join and leave
//     through a Sink: the router's own add (with introspection) and removal (in-flight
//     requests finish, bindings and index entries are dropped), as the admin API's. It
//     removes only the workers it added.
//
// # Concurrency model
//
// Add and Remove serialize on the Fleet's mutex and publish registry snapshots through
// engine.WorkerSet. The dispatch path reaches a worker's Member through its engine.Worker
// (MemberOf, a field read); Admit and Ticket.Done are atomic operations on the breaker, and
// a state change republishes the worker's eligibility at once, so the next pick sees it.
// Each worker's health loop owns its counters; the breaker's cool-down runs on the Clock's
// timer. Upstream is safe for concurrent use. Kubernetes discovery's informer only queues
// pod keys; a few reconciler goroutines (a client-go work queue: never two for one pod)
// read the informer's cache and call the Sink.
//
// # What a caller must release
//
// Every Ticket from Admit must be ended with Done, on every path. Stop ends the health loops,
// timers and telemetry and waits for them; CloseConnections closes every live upstream
// connection (a drain's hard stop). Kubernetes.Run returns when its context is done, its
// informer and reconcilers stopped; the workers it added stay until the fleet stops.
package fleet
