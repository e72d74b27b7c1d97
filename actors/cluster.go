package actors

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/VictoriaMetrics/metrics"
	"github.com/asynkron/protoactor-go/actor"
	"github.com/asynkron/protoactor-go/cluster"
	"github.com/asynkron/protoactor-go/cluster/clusterproviders/etcd"
	"github.com/asynkron/protoactor-go/cluster/identitylookup/disthash"
	"github.com/asynkron/protoactor-go/remote"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"switchyard/actors/clusterpb"
	"switchyard/config"
	"switchyard/engine"
	"switchyard/load/series"
)

// partitionKind is the cluster kind of the affinity partition grains.
const partitionKind = "affinity-partition"

// Gossip state keys of a replica.
const (
	gossipInflight = "switchyard-inflight"
	gossipWorkers  = "switchyard-workers"
	gossipLeaving  = "switchyard-leaving"
)

// Cluster metric names (per replica).
const (
	metricClusterMembers       = "switchyard_cluster_members"
	metricClusterPartitions    = "switchyard_cluster_partitions_owned"
	metricClusterLookups       = "switchyard_cluster_binding_requests_total"
	metricClusterRemoteLatency = "switchyard_cluster_remote_request_duration_seconds"
	metricClusterHandoff       = "switchyard_cluster_handoff_bindings_total"
	metricClusterNearInval     = "switchyard_cluster_near_cache_invalidations_total"
)

// remoteLatencyBuckets are the upper bounds (seconds) of the remote binding request
// histogram: a loopback round trip is tens of microseconds, the request deadline a second.
var remoteLatencyBuckets = []float64{0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1}

// ErrClusterUnavailable: no member could serve a partition (the cluster has no members, or
// the owner did not answer).
var ErrClusterUnavailable = errors.New("cluster unavailable")

// ClusterOptions are a Cluster's collaborators beyond the configuration.
type ClusterOptions struct {
	// Affinity sizes the partition tables (idle timeout, bindings per scope, mailbox) and
	// gives the clock; its CallTimeout bounds a lookup whose owner is this replica.
	Affinity AffinityOptions
	// Counters returns the router-local counters of every worker, for the fleet-wide
	// in-flight counts (engine.WorkerSet's workers). Default: none shared.
	Counters func() map[string]CountersOf
	// OnWorkerChange applies a worker change made on another replica (or learnt late). It
	// is called on the gossip goroutine, one change at a time. Default: none.
	OnWorkerChange func(WorkerChange)
	// Ready gates Counters and OnWorkerChange: neither is called before Ready is closed, so
	// a caller that joins the cluster while it is still being built (the HTTP server: the
	// cluster is its affinity store) closes it once the state the callbacks read is
	// complete. What gossip brings meanwhile is kept and applied when Ready closes. Default
	// (nil): ready at once.
	Ready <-chan struct{}
	// Ticks paces the gossip loop (publishing this replica's counts, applying the worker
	// changes learnt). Default: a ticker of cluster.gossip_interval.
	Ticks <-chan time.Time
	// Metrics receives the switchyard_cluster_* series. Default: the System's set.
	Metrics *metrics.Set
	// Logger receives the cluster's logs. Default: the System's.
	Logger *slog.Logger
}

// CountersOf is what the cluster reads and writes of one worker's router-local counters
// (*load.Counters).
type CountersOf interface {
	LocalInFlight() int64
	LocalDispatched() uint64
	SetPeers(inflight int64, dispatched uint64)
}

// WorkerChange is a change of the fleet made through the admin API of some replica: a
// worker added (Spec, the admin API's JSON body) or removed.
type WorkerChange struct {
	WorkerID string
	Removed  bool
	Spec     []byte
	// Version orders the changes of one worker ID across replicas; Origin (the member ID
	// that made it) breaks ties.
	Version int64
	Origin  string
}

// Cluster joins this router to the other replicas as one Proto.Actor cluster (remote on
// cluster.listen, membership through the automanaged or etcd provider, grains placed by
// rendezvous hashing through disthash). It serves:
//
//   - Affinity: an engine.AffinityStore whose bindings live in cluster.partitions partition
//     grains; a key's partition is a hash of the key, so every replica resolves a key to the
//     same grain, owned by one member. A lookup whose owner is this replica stays in
//     process (the pooled call of the local store); elsewhere it is one remote round trip.
//   - Fleet-wide counters: every gossip interval each replica publishes its router-local
//     in-flight and dispatch counts per worker, and adds the others' into its counters.
//   - Worker changes: PublishWorkerChange shares an admin change; every replica applies the
//     latest change of each worker ID through ClusterOptions.OnWorkerChange.
//
// Leave hands this replica's partitions to their next owners before the process stops.
type Cluster struct {
	sys     *System
	cfg     config.Cluster
	opts    ClusterOptions
	logger  *slog.Logger
	set     *metrics.Set
	c       *cluster.Cluster
	timeout time.Duration // remote round trip
	idle    time.Duration
	perPart int // bindings per scope per partition

	identities []string // partition → grain identity
	placement  atomic.Pointer[placement]
	// local holds the partitions whose grain runs on this replica, by partition.
	local []atomic.Pointer[partitionHost]

	calls sync.Pool // *affinityCall
	stats statsByScope
	// host owns the partition grains' mailbox goroutines. Proto.Actor makes a grain's
	// mailbox itself; the mailbox hands itself to its grain (mailboxOwner).
	host *host

	// near keeps the bindings read from other owners (nil: cluster.near_cache_ttl is 0).
	near *nearCache

	lookups, remote, remoteFailed *metrics.Counter
	// remoteLatency is lock-free (every remote binding request updates it), in its own
	// family: not shared by name, taken out of it on Close.
	remoteLatency *series.Histogram
	latencies     *series.HistogramFamily
	handedOff     *metrics.Counter
	nearSent      *metrics.Counter // invalidations this replica's grains sent
	names         []string

	// placeMu serializes refreshPlacement: the topology, a suspicion, gossip and Leave call
	// it from their own goroutines, and each computes under mu and publishes after, so
	// that unserialized a placement computed before a change could be published after the
	// one computed from it (and stay until the next topology change).
	placeMu sync.Mutex

	mu      sync.Mutex // guards the fields below
	leaving map[string]bool
	// leavingAcks is each other member's latest gossiped list of members it knows are
	// leaving (by member ID); gossipSeen is poked when it or the topology changes.
	leavingAcks map[string][]string
	gossipSeen  chan struct{}
	suspects    map[string]bool // addresses that failed a remote call since the last topology
	members     []*cluster.Member
	peers       map[string]*clusterpb.InflightCounts // member ID → its last counts
	changes     map[string]WorkerChange              // worker ID → latest change known
	pending     []WorkerChange                       // changes learnt, not yet applied

	subs   []*eventSub
	stop   chan struct{}
	wg     sync.WaitGroup
	closed atomic.Bool
	left   atomic.Bool
	// inflight counts the binding requests past their closed check (request); Close waits
	// until none is left before it stops the remote, so that no request of this replica
	// sends to a peer while Proto.Actor's endpoint manager stops (it drops its connection
	// table, and a send then panics). drained is poked when the count drops to zero once
	// closed is set.
	inflight atomic.Int64
	drained  chan struct{}
	// ready is set once ClusterOptions.Ready has closed: the callbacks may run.
	ready atomic.Bool
	// applying serialises applyPeers.
	applying sync.Mutex
}

// eventSub is an event stream subscription to cancel on Close.
type eventSub struct{ unsubscribe func() }

// placement is one topology's partition owners: address per partition, and whether it is
// this replica.
type placement struct {
	owners []string
	// next is each partition's owner should its owner go: where a request whose owner did
	// not answer is tried once (rendezvous over the members less the owner).
	next []string
	self string
	// pids caches the grain PID of each partition for this placement.
	pids []atomic.Pointer[actor.PID]
	n    int // members
}

// NewCluster starts remote on sys's actor system, joins the cluster cfg names and returns
// once this replica is a member. sys must be the process's System; Close (or Leave, then
// Close) stops the cluster and shuts sys down.
func NewCluster(sys *System, cfg config.Cluster, opts ClusterOptions) (cl *Cluster, err error) {
	if sys == nil {
		return nil, errors.New("cannot start cluster: nil actor system")
	}
	if cfg.Partitions <= 0 {
		cfg.Partitions = 64
	}
	if opts.Logger == nil {
		opts.Logger = sys.Logger()
	}
	if opts.Metrics == nil {
		opts.Metrics = sys.set
	}
	// A zero affinity option takes config.Default's value, as in NewAffinityStore.
	ao, d := opts.Affinity, config.Default()
	if ao.IdleTimeout <= 0 {
		ao.IdleTimeout = d.Affinity.IdleTimeout
	}
	if ao.MaxBindings <= 0 {
		ao.MaxBindings = d.Affinity.MaxBindings
	}
	if ao.Mailbox <= 0 {
		ao.Mailbox = d.Actors.Mailbox.Affinity
	}
	if ao.CallTimeout <= 0 {
		ao.CallTimeout = d.Actors.PickTimeout / 4
	}
	if ao.Now == nil {
		ao.Now = time.Now
	}
	opts.Affinity = ao
	c := &Cluster{
		sys:         sys,
		cfg:         cfg,
		opts:        opts,
		logger:      opts.Logger,
		set:         opts.Metrics,
		timeout:     cfg.RequestTimeout,
		idle:        ao.IdleTimeout,
		perPart:     max(1, (ao.MaxBindings+cfg.Partitions-1)/cfg.Partitions),
		local:       make([]atomic.Pointer[partitionHost], cfg.Partitions),
		leaving:     map[string]bool{},
		suspects:    map[string]bool{},
		leavingAcks: map[string][]string{},
		gossipSeen:  make(chan struct{}, 1),
		peers:       map[string]*clusterpb.InflightCounts{},
		changes:     map[string]WorkerChange{},
		stop:        make(chan struct{}),
		drained:     make(chan struct{}, 1),
		host:        newHost(),
	}
	if c.timeout <= 0 {
		c.timeout = ao.CallTimeout
	}
	c.stats.init(c.set)
	c.identities = make([]string, cfg.Partitions)
	for i := range c.identities {
		c.identities[i] = strconv.Itoa(i)
	}
	c.calls.New = func() any { return newAffinityCall() }
	c.lookups = c.counter(metricClusterLookups + `{owner="local"}`)
	c.remote = c.counter(metricClusterLookups + `{owner="remote"}`)
	c.remoteFailed = c.counter(metricClusterLookups + `{owner="remote_failed"}`)
	c.handedOff = c.counter(metricClusterHandoff)
	c.nearSent = c.counter(metricClusterNearInval + `{direction="sent"}`)
	c.near = newNearCache(cfg.NearCacheTTL, cfg.NearCacheEntries, cfg.Partitions,
		c.counter(metricClusterLookups+`{owner="near_cache"}`), c.counter(metricClusterNearInval+`{direction="received"}`))
	c.latencies = series.NewHistogramFamily(c.set, metricClusterRemoteLatency)
	c.remoteLatency = c.latencies.New(metricClusterRemoteLatency, remoteLatencyBuckets)
	c.gauge(metricClusterMembers, func() float64 {
		if p := c.placement.Load(); p != nil {
			return float64(p.n)
		}
		return 0
	})
	c.gauge(metricClusterPartitions, func() float64 {
		n := 0
		for i := range c.local {
			if c.local[i].Load() != nil {
				n++
			}
		}
		return float64(n)
	})

	host, port, err := splitHostPort(cfg.Listen)
	if err != nil {
		c.unregister()
		return nil, fmt.Errorf("cannot start cluster: cluster.listen: %w", err)
	}
	provider, providerLn, err := c.provider(host)
	if err != nil {
		c.unregister()
		return nil, err
	}
	var ropts []remote.ConfigOption
	if cfg.Advertise != "" {
		ropts = append(ropts, remote.WithAdvertisedHost(cfg.Advertise))
	}
	kind := partitionKindOf(actor.PropsFromProducer(func() actor.Actor { return newPartitionActor(c) },
		actor.WithMailbox(func() actor.Mailbox {
			// Proto.Actor spawns grains itself: each activation gets a fresh mailbox, which
			// hands itself to its grain (mailboxOwner) before the grain gets a message.
			return newMailbox(ao.Mailbox, c.host, &sys.counters.kinds[KindPartition],
				&engine.PickError{Outcome: engine.OutcomeOverloaded, Detail: "affinity partition mailbox is full"},
				&engine.PickError{Outcome: engine.OutcomeInternal, Detail: "affinity partition stopped", Err: ErrStopped})
		})))
	ccfg := cluster.Configure(cfg.Name, provider, disthash.New(), remote.Configure(host, port, ropts...),
		cluster.WithKinds(kind), cluster.WithRequestTimeout(c.timeout), cluster.WithRequestLog(false))
	ccfg.GossipInterval = cfg.GossipInterval
	// Proto.Actor's graceful shutdown slept 2 s for its own activations to move. Leave has
	// handed this replica's partitions off and waited until every member routes around it
	// (without Leave they are re-created on their next owners): nothing is left to wait for.
	ccfg.ShutdownWait = 0
	c.c = cluster.New(sys.sys, ccfg)
	if _, ok := sys.sys.ProcessRegistry.Add(nearCacheProcess{c}, nearCacheName); !ok {
		c.unregister()
		closeListener(providerLn)
		return nil, fmt.Errorf("cannot start cluster: the actor system already runs one (process %q)", nearCacheName)
	}

	c.ready.Store(opts.Ready == nil)
	c.subscribe()
	if err := c.startMember(); err != nil {
		c.unsubscribe()
		sys.sys.ProcessRegistry.Remove(&actor.PID{Id: nearCacheName})
		c.unregister()
		closeListener(providerLn)
		return nil, err
	}
	sys.cluster.Store(c)
	c.wg.Add(1)
	go c.gossipLoop()
	return c, nil
}

// partitionKindOf is the partition grains' cluster kind. It is built without
// cluster.NewKind, whose receiver middleware wraps every message a grain receives in an
// envelope (one allocation per binding lookup) only to act on Started and Stopped; the
// partition actor does that itself (partitionActor.Receive).
func partitionKindOf(props *actor.Props) *cluster.Kind {
	return &cluster.Kind{Kind: partitionKind, Props: props}
}

// startMember starts remote and joins; Proto.Actor panics on a provider or listen failure.
func (c *Cluster) startMember() (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("cannot start cluster member: %v", r)
		}
	}()
	c.c.StartMember()
	c.refreshPlacement()
	return nil
}

// provider builds the membership provider cluster.provider names. The automanaged one
// (memberProvider) listens on host (cluster.listen's: 127.0.0.1 by default; empty for every
// interface) at cluster.provider_port, bound here so that a taken port fails the start; its
// Shutdown closes the listener (nil for etcd).
func (c *Cluster) provider(host string) (cluster.ClusterProvider, net.Listener, error) {
	switch c.cfg.Provider {
	case config.ClusterProviderAutomanaged, "":
		ln, err := net.Listen("tcp", net.JoinHostPort(host, strconv.Itoa(c.cfg.ProviderPort)))
		if err != nil {
			return nil, nil, fmt.Errorf("cannot start cluster: cluster.provider_port: %w", err)
		}
		return newMemberProvider(c.cfg.Name, c.cfg.Members, c.cfg.ProviderPort, c.cfg.RefreshInterval, ln, c.logger), ln, nil
	case config.ClusterProviderEtcd:
		// The provider never reads its lease keep-alive channel, so the client would warn
		// about it every second: its own logger is silenced (failures surface as errors).
		p, err := etcd.NewWithConfig(c.cfg.EtcdPrefix, clientv3.Config{Endpoints: c.cfg.EtcdEndpoints, DialTimeout: 5 * time.Second,
			Logger: zap.NewNop()})
		if err != nil {
			return nil, nil, fmt.Errorf("cannot start cluster: etcd: %w", err)
		}
		return p, nil, nil
	}
	return nil, nil, fmt.Errorf("cannot start cluster: unknown provider %q", c.cfg.Provider)
}

// closeListener closes the provider's listener, if any, when the member fails to start.
func closeListener(ln net.Listener) {
	if ln != nil {
		_ = ln.Close()
	}
}

func splitHostPort(s string) (string, int, error) {
	h, p, err := net.SplitHostPort(s)
	if err != nil {
		return "", 0, err
	}
	n, err := strconv.Atoi(p)
	if err != nil {
		return "", 0, fmt.Errorf("bad port %q", p)
	}
	return h, n, nil
}

// Address is this replica's remote address (host:port).
func (c *Cluster) Address() string { return c.sys.sys.Address() }

// MemberID is this replica's member ID.
func (c *Cluster) MemberID() string { return c.sys.sys.ID }

// Members returns the addresses of the current members, sorted.
func (c *Cluster) Members() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]string, 0, len(c.members))
	for _, m := range c.members {
		out = append(out, m.Address())
	}
	slices.Sort(out)
	return out
}

// subscribe follows topology changes, gossip updates and failed endpoints.
func (c *Cluster) subscribe() {
	s := c.sys.sys.EventStream.Subscribe(func(evt any) {
		switch e := evt.(type) {
		case *cluster.ClusterTopology:
			c.mu.Lock()
			c.members = slices.Clone(e.Members)
			clear(c.suspects)
			for _, m := range e.Left {
				delete(c.leaving, m.Id)
				delete(c.leavingAcks, m.Id)
				if pc := c.peers[m.Id]; pc != nil {
					// Its in-flight requests are over for this replica's accounting; its
					// dispatches stay counted (see load.Counters.SetPeers).
					for _, w := range pc.Workers {
						w.Inflight = 0
					}
				}
			}
			c.mu.Unlock()
			c.refreshPlacement()
			c.applyPeers()
			c.poke()
		case *cluster.GossipUpdate:
			c.onGossip(e)
		case *remote.EndpointTerminatedEvent:
			c.suspect(e.Address)
		}
	})
	c.subs = append(c.subs, &eventSub{unsubscribe: func() { c.sys.sys.EventStream.Unsubscribe(s) }})
}

func (c *Cluster) unsubscribe() {
	for _, s := range c.subs {
		s.unsubscribe()
	}
	c.subs = nil
}

// suspect excludes addr from placement until the next topology change: a member whose
// endpoint failed is treated as gone, as the provider will soon confirm.
func (c *Cluster) suspect(addr string) {
	if addr == "" || addr == c.Address() {
		return
	}
	c.mu.Lock()
	known := c.suspects[addr]
	c.suspects[addr] = true
	c.mu.Unlock()
	if !known {
		c.logger.Warn("cluster member unreachable; its partitions move to the next owners", slog.String("member", addr))
		c.refreshPlacement()
	}
}

// refreshPlacement recomputes every partition's owner by rendezvous hashing (the hash
// disthash places grains with) over the members that are neither leaving nor suspect.
func (c *Cluster) refreshPlacement() {
	c.placeMu.Lock()
	defer c.placeMu.Unlock()
	c.mu.Lock()
	var ms cluster.Members
	for _, m := range c.members {
		if c.leaving[m.Id] || c.suspects[m.Address()] {
			continue
		}
		ms = append(ms, m)
	}
	n := len(c.members)
	c.mu.Unlock()
	self := c.Address()
	if len(ms) == 0 {
		// Not a member yet (or alone and leaving): this replica serves its own requests.
		ms = cluster.Members{{Host: "self", Id: c.MemberID(), Kinds: []string{partitionKind}}}
		n = max(n, 1)
	}
	rdv := cluster.NewRendezvous()
	rdv.UpdateMembers(ms)
	// without[addr] places over the members less addr (next owners).
	without := map[string]*cluster.Rendezvous{}
	if len(ms) > 1 {
		for k, m := range ms {
			others := append(slices.Clone(ms[:k]), ms[k+1:]...)
			r := cluster.NewRendezvous()
			r.UpdateMembers(others)
			without[m.Address()] = r
		}
	}
	p := &placement{owners: make([]string, len(c.identities)), next: make([]string, len(c.identities)), self: self, n: n,
		pids: make([]atomic.Pointer[actor.PID], len(c.identities))}
	for i, id := range c.identities {
		ci := &cluster.ClusterIdentity{Identity: id, Kind: partitionKind}
		o := rdv.GetByClusterIdentity(ci)
		if r := without[o]; r != nil {
			p.next[i] = r.GetByClusterIdentity(ci)
		}
		if o == "self:0" {
			o = self
		}
		p.owners[i] = o
	}
	old := c.placement.Swap(p)
	if c.near != nil {
		// After the swap: a request that read a partition's generation before this bump
		// may have asked the old owner, and its copy must not survive.
		for i := range p.owners {
			if old == nil || old.owners[i] != p.owners[i] {
				c.near.invalidate(i)
			}
		}
	}
}

// partitionOf returns key's partition: FNV-1a of the key, so that every scope of one session
// (prefill and decode, every bucket) lives in one grain.
func (c *Cluster) partitionOf(key string) int {
	p, _ := c.partitionHash(key)
	return p
}

// partitionHash returns key's partition and its FNV-1a hash.
func (c *Cluster) partitionHash(key string) (int, uint64) {
	h := engine.FNV64(engine.FNVOffset, key)
	return int(h % uint64(len(c.identities))), h
}

// pidOf returns partition p's grain PID under pl, activating it through its owner's
// partition activator on first use.
func (c *Cluster) pidOf(pl *placement, p int, timeout time.Duration) (*actor.PID, error) {
	if pid := pl.pids[p].Load(); pid != nil {
		return pid, nil
	}
	// Slow path: first use of the partition under this placement.
	owner := pl.owners[p]
	if owner == pl.self {
		if h := c.local[p].Load(); h != nil {
			pl.pids[p].Store(h.pid)
			return h.pid, nil
		}
	}
	pid, err := c.activate(owner, p, timeout)
	if err != nil {
		return nil, err
	}
	pl.pids[p].Store(pid)
	return pid, nil
}

// activate asks owner's partition activator for partition p's grain. A member that does not
// answer is not suspected: slow is not gone (the membership provider and lost connections
// decide that).
func (c *Cluster) activate(owner string, p int, timeout time.Duration) (*actor.PID, error) {
	if owner == "" {
		return nil, fmt.Errorf("partition %d has no owner: %w", p, ErrClusterUnavailable)
	}
	activator := actor.NewPID(owner, disthash.PartitionActivatorActorName)
	res, err := c.sys.root.RequestFuture(activator, &cluster.ActivationRequest{
		ClusterIdentity: cluster.NewClusterIdentity(c.identities[p], partitionKind)}, timeout).Result()
	if err != nil {
		return nil, fmt.Errorf("cannot activate partition %d on %s: %w: %w", p, owner, ErrClusterUnavailable, err)
	}
	ar, ok := res.(*cluster.ActivationResponse)
	if !ok || ar.Pid == nil {
		return nil, fmt.Errorf("cannot activate partition %d on %s: %w", p, owner, ErrClusterUnavailable)
	}
	return ar.Pid, nil
}

// counter registers a cluster-wide counter.
func (c *Cluster) counter(name string) *metrics.Counter {
	c.names = append(c.names, name)
	return c.set.GetOrCreateCounter(name)
}

// gauge registers a cluster-wide gauge.
func (c *Cluster) gauge(name string, f func() float64) {
	c.names = append(c.names, name)
	c.set.GetOrCreateGauge(name, f)
}

func (c *Cluster) unregister() {
	for _, n := range c.names {
		c.set.UnregisterMetric(n)
	}
	c.names = nil
	c.latencies.Remove(c.remoteLatency)
}

// Leave hands every partition this replica owns to its next owner and waits until every
// other member routes around this replica, within ctx (cluster.handoff_timeout). Call it
// once no request of this replica is in flight (after the HTTP drain); Close then leaves the
// membership. Bindings a failed hand-off could not move are logged and counted as lost.
func (c *Cluster) Leave(ctx context.Context) error {
	if c.left.Swap(true) {
		return nil
	}
	me := c.MemberID()
	c.mu.Lock()
	c.leaving[me] = true
	c.mu.Unlock()
	c.refreshPlacement() // owners without this replica
	// Every partition hands off at once (each is its own actor); a partition whose target
	// failed is tried once more on its next owner (the target is suspected), all within
	// ctx (cluster.handoff_timeout).
	var errs []error
	todo := make([]int, 0, len(c.local))
	for p := range c.local {
		if c.local[p].Load() != nil {
			todo = append(todo, p)
		}
	}
	for round := 0; round < 2 && len(todo) > 0; round++ {
		pl := c.placement.Load()
		timeout := c.cfg.HandoffTimeout
		if d, ok := ctx.Deadline(); ok {
			timeout = min(timeout, time.Until(d))
		}
		if timeout <= 0 {
			errs = append(errs, fmt.Errorf("%d partitions not handed off: %w", len(todo), context.DeadlineExceeded))
			break
		}
		type pending struct {
			p      int
			target string
			call   *call[error]
		}
		var sent []pending
		for _, p := range todo {
			h := c.local[p].Load()
			target := pl.owners[p]
			if h == nil || target == pl.self || target == "" {
				continue // stopped meanwhile, or alone: nobody to hand to
			}
			cl := newCall[error]()
			cl.arm(timeout)
			c.sys.root.Send(h.pid, &handOff{target: target, timeout: timeout, call: cl})
			sent = append(sent, pending{p, target, cl})
		}
		todo = todo[:0]
		var failed []error
		for _, s := range sent {
			err, ok := s.call.wait()
			if !ok {
				err = fmt.Errorf("partition %d: hand-off to %s timed out", s.p, s.target)
			}
			if err != nil {
				failed = append(failed, err)
				todo = append(todo, s.p)
				c.suspect(s.target)
			}
		}
		if len(todo) == 0 || round == 1 {
			errs = append(errs, failed...)
		}
	}
	// Tell the others, and wait until each lists this replica as leaving.
	c.publishLeaving()
	if err := c.awaitLeavingSeen(ctx); err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		c.logger.Error("cluster hand-off incomplete", slog.Any("error", err))
		return fmt.Errorf("cannot hand off every partition: %w", err)
	}
	return nil
}

// awaitLeavingSeen waits until every other member's gossip lists this replica as leaving.
// The acknowledgements come from the gossip update events (onGossip), never from
// Gossip.GetState: that hands out the gossip actor's own entries, which it rewrites in place
// while the caller reads them.
func (c *Cluster) awaitLeavingSeen(ctx context.Context) error {
	me := c.MemberID()
	for {
		c.mu.Lock()
		missing := 0
		for _, m := range c.members {
			if m.Id != me && !slices.Contains(c.leavingAcks[m.Id], me) {
				missing++
			}
		}
		c.mu.Unlock()
		if missing == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%d members did not confirm the leave: %w", missing, ctx.Err())
		case <-c.gossipSeen:
		}
	}
}

// poke wakes awaitLeavingSeen after a gossip or topology change.
func (c *Cluster) poke() {
	select {
	case c.gossipSeen <- struct{}{}:
	default:
	}
}

func (c *Cluster) memberIDs() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]string, 0, len(c.members))
	for _, m := range c.members {
		out = append(out, m.Id)
	}
	return out
}

// publishLeaving publishes the members this replica knows are leaving.
func (c *Cluster) publishLeaving() {
	c.mu.Lock()
	ids := make([]string, 0, len(c.leaving))
	for id := range c.leaving {
		ids = append(ids, id)
	}
	c.mu.Unlock()
	slices.Sort(ids)
	c.c.Gossip.SetState(gossipLeaving, &clusterpb.LeavingMembers{Ids: ids})
}

// Close stops the gossip loop, waits for the binding requests in flight (new ones fail at
// once), leaves the membership (gracefully: the provider deregisters this replica; its
// grains stop) and shuts the actor system down. Components on the System
// must be closed first. Without a prior Leave, partitions are not handed off: their
// bindings are re-created on the next owners as requests arrive.
func (c *Cluster) Close() {
	if c.closed.Swap(true) {
		return
	}
	close(c.stop)
	c.wg.Wait()
	c.waitRequests()
	c.unsubscribe()
	func() {
		defer func() {
			if r := recover(); r != nil {
				c.logger.Warn("cluster shutdown panicked", slog.Any("panic", r))
			}
		}()
		c.c.Shutdown(true)
	}()
	c.host.shutdown()
	c.sys.sys.ProcessRegistry.Remove(&actor.PID{Id: nearCacheName})
	c.unregister()
	c.stats.unregister()
}

// waitRequests waits until no binding request is in flight (closed is set: none starts),
// at most as long as one can last (cluster.request_timeout, plus a local call's timeout).
func (c *Cluster) waitRequests() {
	if c.inflight.Load() == 0 {
		return
	}
	bound := time.NewTimer(c.timeout + c.opts.Affinity.CallTimeout)
	defer bound.Stop()
	for c.inflight.Load() > 0 {
		select {
		case <-c.drained:
		case <-bound.C:
			c.logger.Warn("cluster closing with binding requests in flight", slog.Int64("requests", c.inflight.Load()))
			return
		}
	}
}

// endRequest ends a binding request counted in inflight.
func (c *Cluster) endRequest() {
	if c.inflight.Add(-1) == 0 && c.closed.Load() {
		select {
		case c.drained <- struct{}{}:
		default:
		}
	}
}

// statsByScope are the per-scope binding series shared by every partition grain of this
// replica.
type statsByScope struct {
	mu sync.Mutex
	m  map[engine.AffinityScope]*scopeStats
	o  *series.Owned
}

func (s *statsByScope) init(set *metrics.Set) {
	s.m = map[engine.AffinityScope]*scopeStats{}
	s.o = series.Own(set)
}

func (s *statsByScope) of(scope engine.AffinityScope) *scopeStats {
	s.mu.Lock()
	defer s.mu.Unlock()
	if st := s.m[scope]; st != nil {
		return st
	}
	st := newScopeStats(s.o, "model", scope.Model, "bucket", scope.BucketID, "stage", scope.Stage.String())
	s.m[scope] = st
	return st
}

func (s *statsByScope) unregister() { s.o.Unregister() }
