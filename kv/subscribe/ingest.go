package subscribe

import (
	"log/slog"

	"switchyard/kv/events"
	"switchyard/kv/index"
	"switchyard/load"
)

// Ingestor applies one worker's raw KV-event payloads (msgpack batches) to an index: decode,
// key (the engine's hashes once verified, else re-keyed from token IDs) and write. It is the
// subscriptions' ingest path without their transport and sequence tracking, for other
// transports and for measuring ingest. An Ingestor is owned by one goroutine.
type Ingestor struct {
	dec   events.Decoder
	batch events.EventBatch
	ap    *applier
}

// NewIngestor returns an ingestor of worker's events on index x; rekey forces re-keying from
// token IDs (as an index keyed by the router's own keys does for every engine).
// The worker must be registered (SetWorker) before its batches are applied.
func NewIngestor(x *index.Index, worker string, rekey bool, log *slog.Logger) *Ingestor {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	scheme := HashSchemeAuto
	if rekey {
		scheme = HashSchemeRekey
	}
	return &Ingestor{ap: newApplier(x, worker, scheme, log, load.LogThrottle{Logger: log})}
}

// Apply decodes payload and applies its events as published by DP rank rank (a batch's own
// rank wins). It returns the number of events applied; a malformed payload is an error
// wrapping ErrMalformed and changes nothing.
func (g *Ingestor) Apply(payload []byte, rank int) (int, error) {
	g.dec.SkipTokenIDs = !g.ap.needsTokens()
	if err := g.dec.Decode(payload, &g.batch); err != nil {
		g.ap.m.BatchesMalformed.Inc()
		return 0, err
	}
	if err := g.ap.apply(&g.batch, rank); err != nil {
		return 0, err
	}
	g.ap.m.BatchesOK.Inc()
	return len(g.batch.Events), nil
}
