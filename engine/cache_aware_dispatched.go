package engine

import (
	"hash/maphash"
	"time"
	"unsafe"

	"switchyard/kv"
)

// The latency decision's memory of dispatched prompts. A prompt the router sent to an
// engine reaches the prefix index only once the engine has prefilled it and published its KV
// events: while it waits in the engine's queue and while it is prefilled, a request sharing
// its prefix (a system prompt, the next question of a conversation sent before the answer
// ends, a retry) finds no holder and goes wherever the load is lowest, where it computes the
// prefix again. The memory closes that gap: cache_aware remembers, for the last
// dispatchedEntries prompts it placed within CacheAwareSettings.DispatchWindow, which engine
// got them and fingerprints of their leading tokens, and counts a request's longest
// fingerprinted prefix shared with one of them as held by that engine (the larger of that and
// the index's match). The latency decision then weighs it like any other hit: the engine's
// queue already holds the earlier prompt's prefill, after which the prefix is cached.
//
// Fingerprints are chained keyed hashes (hash/maphash, a per-policy random seed) of the
// model and every dispatchedStep tokens, so a match is a whole multiple of dispatchedStep
// tokens, at most dispatchedSteps of them.

const (
	// dispatchedStep is the granularity of a remembered prefix, tokens.
	dispatchedStep = 1024
	// dispatchedSteps bounds a remembered prefix: 128 steps, 131,072 tokens.
	dispatchedSteps = 128
	// dispatchedEntries is how many dispatched prompts are remembered.
	dispatchedEntries = 128
)

// dispatchedPrompt is one remembered dispatch.
type dispatchedPrompt struct {
	worker *Worker
	at     time.Time
	steps  int
	fp     [dispatchedSteps]uint64
}

// dispatchedMemory is a ring of remembered dispatches, owned with its policy.
type dispatchedMemory struct {
	seed    maphash.Seed
	hash    maphash.Hash
	ring    []dispatchedPrompt // allocated on first use
	next    int
	steps   int // of the current request's fingerprints
	current [dispatchedSteps]uint64
}

// fingerprint computes the current request's fingerprints from its prompt tokens; it
// reports whether there is at least one.
func (d *dispatchedMemory) fingerprint(model string, tokens []uint32) bool {
	d.steps = min(len(tokens)/dispatchedStep, dispatchedSteps)
	if d.steps == 0 {
		return false
	}
	if d.ring == nil {
		d.seed = maphash.MakeSeed()
		d.ring = make([]dispatchedPrompt, dispatchedEntries)
	}
	d.hash.SetSeed(d.seed)
	d.hash.WriteString(model)
	for i := range d.steps {
		chunk := tokens[i*dispatchedStep : (i+1)*dispatchedStep]
		d.hash.Write(unsafe.Slice((*byte)(unsafe.Pointer(&chunk[0])), len(chunk)*4))
		d.current[i] = d.hash.Sum64()
	}
	return true
}

// matched returns the longest prefix of the current request, in tokens, that a prompt
// dispatched to w since notBefore shares.
func (d *dispatchedMemory) matched(w *Worker, notBefore time.Time) int64 {
	best := 0
	for i := range d.ring {
		e := &d.ring[i]
		if e.worker != w || e.at.Before(notBefore) || e.steps <= best {
			continue
		}
		n := min(e.steps, d.steps)
		k := 0
		for k < n && e.fp[k] == d.current[k] {
			k++
		}
		best = max(best, k)
	}
	return int64(best) * dispatchedStep
}

// remember records the current request as dispatched to w at now.
func (d *dispatchedMemory) remember(w *Worker, now time.Time) {
	e := &d.ring[d.next]
	d.next = (d.next + 1) % len(d.ring)
	e.worker, e.at, e.steps = w, now, d.steps
	copy(e.fp[:d.steps], d.current[:d.steps])
}

// promptTokens returns the request's prompt tokens and model when its prefix lookup carries
// them (a PrefixMemo), else nil.
func promptTokens(req *PickRequest) (string, []uint32) {
	if req.BucketRequest == nil || req.Prefix == nil {
		return "", nil
	}
	m, ok := req.Prefix.(*kv.PrefixMemo)
	if !ok || m == nil {
		return "", nil
	}
	return m.Model(), m.Tokens()
}
