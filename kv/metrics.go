package kv

import (
	"errors"
	"math"
	"time"

	"github.com/VictoriaMetrics/metrics"

	"switchyard/load/series"
	"switchyard/load/zmtp"
)

// Metrics are the kv packages' metric handles, created once on a set and shared by the index,
// the subscriptions and the cache sources of one process. The zero of every counter is
// exported from start-up, so dashboards see a flat line rather than a missing series. The
// counters are exported fields for the sub-packages that count; readers use the accessors
// (Ingest, LocalLookups, RemoteLookups, HashCacheChunks).
type Metrics struct {
	set *metrics.Set

	// Lookups, per source kind (local, remote) and outcome.
	lookups [numSourceKinds]lookupMetrics

	// Ingest.
	OpsApplied       *metrics.Counter // block operations handed to shards
	OpsDroppedBusy   *metrics.Counter // block operations refused by a full shard mailbox
	OpsDroppedUnkey  *metrics.Counter // stores that could not be re-keyed (parent unknown, token IDs short, a map full)
	BatchesOK        *metrics.Counter
	BatchesMalformed *metrics.Counter
	BatchesUnknown   *metrics.Counter // bound SUB: topic of no known worker
	Gaps             *metrics.Counter
	Replays          *metrics.Counter
	ReplayFailures   *metrics.Counter
	Reconnects       *metrics.Counter
	HashMismatches   *metrics.Counter
	// Publishers disconnected for what they sent (switchyard_zmq_peer_drops_total).
	PeerDrops *zmtp.Metrics
	Clears    [numClearReasons]*metrics.Counter

	// The index: operations dropped because their owner was cleared, blocks evicted by the
	// memory bound (every shard adds to them once per batch).
	IndexStale, IndexEvicted *metrics.Counter

	// Lookup hashing: prompt chunks found in the hash cache, and not.
	HashCacheHits, HashCacheMisses *metrics.Counter

	// eventLag is the age of each applied batch: receipt after apply minus the engine's
	// batch timestamp (a classic histogram).
	eventLag *metrics.PrometheusHistogram
}

// eventLagBuckets are the `le` upper bounds, in seconds, of switchyard_kv_event_lag_seconds.
var eventLagBuckets = []float64{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300}

// metricLookupDuration is the lookup duration histogram family, by source kind.
const metricLookupDuration = `switchyard_kv_lookup_duration_seconds`

// lookupBuckets are the `le` upper bounds, in seconds, of switchyard_kv_lookup_duration_seconds:
// a local lookup takes microseconds, a remote one up to cache_aware.query_timeout.
var lookupBuckets = []float64{0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1}

type lookupMetrics struct {
	ok, unavailable, rejected *metrics.Counter
	seconds                   *series.Histogram // lock-free: every cache_aware request updates it
}

// SourceKind labels lookup metrics.
type SourceKind uint8

const (
	SourceLocal SourceKind = iota
	SourceRemote
	numSourceKinds
)

var sourceKindNames = [numSourceKinds]string{"local", "remote"}

// ClearReason labels why an owner's entries were cleared.
type ClearReason uint8

const (
	ClearAllBlocks ClearReason = iota // AllBlocksCleared event
	ClearRestart                      // sequence went backwards: publisher restarted
	ClearGap                          // sequence gap without a successful replay
	ClearDropped                      // a shard refused a batch
	ClearRemoved                      // worker removed
	ClearRekey                        // hashes turned out not reproducible: re-keyed from scratch
	ClearReconnect                    // the connection was lost: what was published meanwhile is unknown
	numClearReasons
)

var clearReasonNames = [numClearReasons]string{"all_blocks_cleared", "restart", "gap", "dropped", "removed", "rekey", "reconnect"}

// NewMetrics creates the handles on set; a nil set gets a private one (metrics kept but not
// exported). Call it once per set: the lookup duration histograms are not shared by name.
func NewMetrics(set *metrics.Set) *Metrics {
	if set == nil {
		set = metrics.NewSet()
	}
	m := &Metrics{set: set}
	durations := series.NewHistogramFamily(set, metricLookupDuration)
	for k := range numSourceKinds {
		src := `source="` + sourceKindNames[k] + `"`
		m.lookups[k] = lookupMetrics{
			ok:          set.GetOrCreateCounter(`switchyard_kv_lookups_total{` + src + `,outcome="ok"}`),
			unavailable: set.GetOrCreateCounter(`switchyard_kv_lookups_total{` + src + `,outcome="unavailable"}`),
			rejected:    set.GetOrCreateCounter(`switchyard_kv_lookups_total{` + src + `,outcome="rejected"}`),
			seconds:     durations.New(metricLookupDuration+`{`+src+`}`, lookupBuckets),
		}
	}
	m.OpsApplied = set.GetOrCreateCounter(`switchyard_kv_block_ops_total{result="applied"}`)
	m.OpsDroppedBusy = set.GetOrCreateCounter(`switchyard_kv_block_ops_total{result="dropped_busy"}`)
	m.OpsDroppedUnkey = set.GetOrCreateCounter(`switchyard_kv_block_ops_total{result="dropped_unkeyed"}`)
	m.BatchesOK = set.GetOrCreateCounter(`switchyard_kv_event_batches_total{result="ok"}`)
	m.BatchesMalformed = set.GetOrCreateCounter(`switchyard_kv_event_batches_total{result="malformed"}`)
	m.BatchesUnknown = set.GetOrCreateCounter(`switchyard_kv_event_batches_total{result="unknown_engine"}`)
	m.Gaps = set.GetOrCreateCounter(`switchyard_kv_sequence_gaps_total`)
	m.Replays = set.GetOrCreateCounter(`switchyard_kv_replays_total{result="ok"}`)
	m.ReplayFailures = set.GetOrCreateCounter(`switchyard_kv_replays_total{result="failed"}`)
	m.Reconnects = set.GetOrCreateCounter(`switchyard_kv_reconnects_total`)
	m.HashMismatches = set.GetOrCreateCounter(`switchyard_kv_hash_mismatches_total`)
	m.PeerDrops = zmtp.NewMetrics(set, "kv_events")
	m.HashCacheHits = set.GetOrCreateCounter(`switchyard_kv_hash_cache_chunks_total{result="hit"}`)
	m.HashCacheMisses = set.GetOrCreateCounter(`switchyard_kv_hash_cache_chunks_total{result="miss"}`)
	for r := range numClearReasons {
		m.Clears[r] = set.GetOrCreateCounter(`switchyard_kv_owner_clears_total{reason="` + clearReasonNames[r] + `"}`)
	}
	m.IndexStale = set.GetOrCreateCounter(`switchyard_kv_index_stale_ops_total`)
	m.IndexEvicted = set.GetOrCreateCounter(`switchyard_kv_index_evicted_blocks_total`)
	m.eventLag = set.GetOrCreatePrometheusHistogramExt(`switchyard_kv_event_lag_seconds`, eventLagBuckets)
	return m
}

// ObserveLag records how old a batch stamped ts (unix seconds, the engine's clock) is at now.
// A batch without a timestamp is not counted; an engine clock ahead of the router's counts
// as no lag.
func (m *Metrics) ObserveLag(ts float64, now time.Time) {
	if !(ts > 0) || math.IsInf(ts, 1) {
		return
	}
	lag := float64(now.UnixNano())/1e9 - ts
	m.eventLag.Update(max(lag, 0))
}

// Set returns the set the handles live on.
func (m *Metrics) Set() *metrics.Set { return m.set }

// ObserveLookup records one lookup of a source kind.
func (m *Metrics) ObserveLookup(k SourceKind, start time.Time, err error) {
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
	return m.HashCacheHits.Get(), m.HashCacheMisses.Get()
}

// LookupCounts are the lookups a source kind answered, by outcome.
type LookupCounts struct {
	OK, Unavailable, Rejected uint64
}

// LocalLookups returns the outcome counts of local-index lookups.
func (m *Metrics) LocalLookups() LookupCounts { return m.lookups[SourceLocal].counts() }

// RemoteLookups returns the outcome counts of remote-indexer lookups.
func (m *Metrics) RemoteLookups() LookupCounts { return m.lookups[SourceRemote].counts() }

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
		OpsApplied: m.OpsApplied.Get(), OpsDroppedBusy: m.OpsDroppedBusy.Get(), OpsDroppedUnkeyed: m.OpsDroppedUnkey.Get(),
		Batches: m.BatchesOK.Get(), Malformed: m.BatchesMalformed.Get(), UnknownEngine: m.BatchesUnknown.Get(),
		Gaps: m.Gaps.Get(), Replays: m.Replays.Get(), ReplayFailures: m.ReplayFailures.Get(), Reconnects: m.Reconnects.Get(),
		HashMismatches:  m.HashMismatches.Get(),
		ClearsAllBlocks: m.Clears[ClearAllBlocks].Get(), ClearsRestart: m.Clears[ClearRestart].Get(),
		ClearsGap: m.Clears[ClearGap].Get(), ClearsDropped: m.Clears[ClearDropped].Get(),
		ClearsRemoved: m.Clears[ClearRemoved].Get(), ClearsRekey: m.Clears[ClearRekey].Get(),
		ClearsReconnect: m.Clears[ClearReconnect].Get(),
	}
}
