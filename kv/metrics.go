package kv

import (
	"errors"
	"math"
	"time"

	"github.com/VictoriaMetrics/metrics"

	"switchyard/load/zmtp"
)

// Metrics are the KV package's metric handles, created once on a set and shared by the index,
// the subscriptions and the cache sources of one process. The zero of every counter is
// exported from start-up, so dashboards see a flat line rather than a missing series.
type Metrics struct {
	set *metrics.Set

	// Lookups, per source kind (local, remote) and outcome.
	lookups [numSourceKinds]lookupMetrics

	// Ingest.
	opsApplied       *metrics.Counter // block operations handed to shards
	opsDroppedBusy   *metrics.Counter // block operations refused by a full shard mailbox
	opsDroppedUnkey  *metrics.Counter // stores that could not be re-keyed (parent unknown)
	batchesOK        *metrics.Counter
	batchesMalformed *metrics.Counter
	batchesUnknown   *metrics.Counter // bound SUB: topic of no known worker
	gaps             *metrics.Counter
	replays          *metrics.Counter
	replayFailures   *metrics.Counter
	reconnects       *metrics.Counter
	hashMismatches   *metrics.Counter
	// Publishers disconnected for what they sent (switchyard_zmq_peer_drops_total).
	peerDrops *zmtp.Metrics
	clears    [numClearReasons]*metrics.Counter

	// The index: operations dropped because their owner was cleared, blocks evicted by the
	// memory bound (every shard adds to them once per batch).
	indexStale, indexEvicted *metrics.Counter

	// Lookup hashing: prompt chunks found in the hash cache, and not.
	hashCacheHits, hashCacheMisses *metrics.Counter

	// eventLag is the age of each applied batch: receipt after apply minus the engine's
	// batch timestamp (a classic histogram).
	eventLag *metrics.PrometheusHistogram
}

// eventLagBuckets are the `le` upper bounds, in seconds, of switchyard_kv_event_lag_seconds.
var eventLagBuckets = []float64{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300}

// lookupBuckets are the `le` upper bounds, in seconds, of switchyard_kv_lookup_duration_seconds:
// a local lookup takes microseconds, a remote one up to cache_aware.query_timeout.
var lookupBuckets = []float64{0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1}

type lookupMetrics struct {
	ok, unavailable, rejected *metrics.Counter
	seconds                   *metrics.PrometheusHistogram
}

// sourceKind labels lookup metrics.
type sourceKind uint8

const (
	sourceLocal sourceKind = iota
	sourceRemote
	numSourceKinds
)

var sourceKindNames = [numSourceKinds]string{"local", "remote"}

// clearReason labels why an owner's entries were cleared.
type clearReason uint8

const (
	clearAllBlocks clearReason = iota // AllBlocksCleared event
	clearRestart                      // sequence went backwards: publisher restarted
	clearGap                          // sequence gap without a successful replay
	clearDropped                      // a shard refused a batch
	clearRemoved                      // worker removed
	clearRekey                        // hashes turned out not reproducible: re-keyed from scratch
	clearReconnect                    // the connection was lost: what was published meanwhile is unknown
	numClearReasons
)

var clearReasonNames = [numClearReasons]string{"all_blocks_cleared", "restart", "gap", "dropped", "removed", "rekey", "reconnect"}

// NewMetrics creates the handles on set; a nil set gets a private one (metrics kept but not
// exported).
func NewMetrics(set *metrics.Set) *Metrics {
	if set == nil {
		set = metrics.NewSet()
	}
	m := &Metrics{set: set}
	for k := range numSourceKinds {
		src := `source="` + sourceKindNames[k] + `"`
		m.lookups[k] = lookupMetrics{
			ok:          set.GetOrCreateCounter(`switchyard_kv_lookups_total{` + src + `,outcome="ok"}`),
			unavailable: set.GetOrCreateCounter(`switchyard_kv_lookups_total{` + src + `,outcome="unavailable"}`),
			rejected:    set.GetOrCreateCounter(`switchyard_kv_lookups_total{` + src + `,outcome="rejected"}`),
			seconds:     set.GetOrCreatePrometheusHistogramExt(`switchyard_kv_lookup_duration_seconds{`+src+`}`, lookupBuckets),
		}
	}
	m.opsApplied = set.GetOrCreateCounter(`switchyard_kv_block_ops_total{result="applied"}`)
	m.opsDroppedBusy = set.GetOrCreateCounter(`switchyard_kv_block_ops_total{result="dropped_busy"}`)
	m.opsDroppedUnkey = set.GetOrCreateCounter(`switchyard_kv_block_ops_total{result="dropped_unkeyed"}`)
	m.batchesOK = set.GetOrCreateCounter(`switchyard_kv_event_batches_total{result="ok"}`)
	m.batchesMalformed = set.GetOrCreateCounter(`switchyard_kv_event_batches_total{result="malformed"}`)
	m.batchesUnknown = set.GetOrCreateCounter(`switchyard_kv_event_batches_total{result="unknown_engine"}`)
	m.gaps = set.GetOrCreateCounter(`switchyard_kv_sequence_gaps_total`)
	m.replays = set.GetOrCreateCounter(`switchyard_kv_replays_total{result="ok"}`)
	m.replayFailures = set.GetOrCreateCounter(`switchyard_kv_replays_total{result="failed"}`)
	m.reconnects = set.GetOrCreateCounter(`switchyard_kv_reconnects_total`)
	m.hashMismatches = set.GetOrCreateCounter(`switchyard_kv_hash_mismatches_total`)
	m.peerDrops = zmtp.NewMetrics(set, "kv_events")
	m.hashCacheHits = set.GetOrCreateCounter(`switchyard_kv_hash_cache_chunks_total{result="hit"}`)
	m.hashCacheMisses = set.GetOrCreateCounter(`switchyard_kv_hash_cache_chunks_total{result="miss"}`)
	for r := range numClearReasons {
		m.clears[r] = set.GetOrCreateCounter(`switchyard_kv_owner_clears_total{reason="` + clearReasonNames[r] + `"}`)
	}
	m.indexStale = set.GetOrCreateCounter(`switchyard_kv_index_stale_ops_total`)
	m.indexEvicted = set.GetOrCreateCounter(`switchyard_kv_index_evicted_blocks_total`)
	m.eventLag = set.GetOrCreatePrometheusHistogramExt(`switchyard_kv_event_lag_seconds`, eventLagBuckets)
	return m
}

// observeLag records how old a batch stamped ts (unix seconds, the engine's clock) is at now.
// A batch without a timestamp is not counted; an engine clock ahead of the router's counts
// as no lag.
func (m *Metrics) observeLag(ts float64, now time.Time) {
	if !(ts > 0) || math.IsInf(ts, 1) {
		return
	}
	lag := float64(now.UnixNano())/1e9 - ts
	m.eventLag.Update(max(lag, 0))
}

// Set returns the set the handles live on.
func (m *Metrics) Set() *metrics.Set { return m.set }

// observeLookup records one lookup of a source kind.
func (m *Metrics) observeLookup(k sourceKind, start time.Time, err error) {
	lm := &m.lookups[k]
	lm.seconds.UpdateDuration(start)
	switch {
	case err == nil:
		lm.ok.Inc()
	case errors.Is(err, ErrRejected):
		lm.rejected.Inc()
	default:
		lm.unavailable.Inc()
	}
}

// HashCacheChunks returns how many prompt chunks lookups found in the hash cache, and how many
// they looked for in vain.
func (m *Metrics) HashCacheChunks() (hits, misses uint64) {
	return m.hashCacheHits.Get(), m.hashCacheMisses.Get()
}

// LookupCounts are the lookups a source kind answered, by outcome.
type LookupCounts struct {
	OK, Unavailable, Rejected uint64
}

// LocalLookups returns the outcome counts of local-index lookups.
func (m *Metrics) LocalLookups() LookupCounts { return m.lookups[sourceLocal].counts() }

// RemoteLookups returns the outcome counts of remote-indexer lookups.
func (m *Metrics) RemoteLookups() LookupCounts { return m.lookups[sourceRemote].counts() }

func (lm *lookupMetrics) counts() LookupCounts {
	return LookupCounts{OK: lm.ok.Get(), Unavailable: lm.unavailable.Get(), Rejected: lm.rejected.Get()}
}

// IngestCounts are the subscription side's counters.
type IngestCounts struct {
	OpsApplied, OpsDroppedBusy, OpsDroppedUnkeyed uint64
	Batches, Malformed, UnknownEngine             uint64
	Gaps, Replays, ReplayFailures, Reconnects     uint64
	HashMismatches                                uint64
	ClearsAllBlocks, ClearsRestart, ClearsGap     uint64
	ClearsDropped, ClearsRemoved, ClearsRekey     uint64
	ClearsReconnect                               uint64
}

// Ingest returns the ingest counters.
func (m *Metrics) Ingest() IngestCounts {
	return IngestCounts{
		OpsApplied: m.opsApplied.Get(), OpsDroppedBusy: m.opsDroppedBusy.Get(), OpsDroppedUnkeyed: m.opsDroppedUnkey.Get(),
		Batches: m.batchesOK.Get(), Malformed: m.batchesMalformed.Get(), UnknownEngine: m.batchesUnknown.Get(),
		Gaps: m.gaps.Get(), Replays: m.replays.Get(), ReplayFailures: m.replayFailures.Get(), Reconnects: m.reconnects.Get(),
		HashMismatches:  m.hashMismatches.Get(),
		ClearsAllBlocks: m.clears[clearAllBlocks].Get(), ClearsRestart: m.clears[clearRestart].Get(),
		ClearsGap: m.clears[clearGap].Get(), ClearsDropped: m.clears[clearDropped].Get(),
		ClearsRemoved: m.clears[clearRemoved].Get(), ClearsRekey: m.clears[clearRekey].Get(),
		ClearsReconnect: m.clears[clearReconnect].Get(),
	}
}
