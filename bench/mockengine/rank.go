package mockengine

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"switchyard/kv/events"
	"switchyard/kv/hashing"
	"switchyard/load"
)

// Errors a sequence can finish with.
var (
	errAborted   = errors.New("request aborted")
	errRestarted = errors.New("engine restarted")
	errClosed    = errors.New("engine closed")
)

// seqState is where a sequence is in the scheduler.
type seqState uint8

const (
	stWaiting seqState = iota
	stPrefill
	stRunning
	stDone
)

// seq is one generated sequence: one prompt and one sample of it.
type seq struct {
	job       *job
	index     int // choice index within the job
	item      int // batch item (prompt) index
	prompt    []uint32
	hashes    []int64        // hashes of the prompt's whole pages
	last      hashing.Digest // digest of the last whole prompt page, when hashes is not empty
	maxTokens int
	seed      uint64
	room      uint64 // bootstrap room a prefill engine completes
	hasRoom   bool

	// Scheduler state, guarded by the rank's mutex.
	state       seqState
	path        []*page
	reserve     int // KV tokens reserved and not yet in the tree
	estUncached int // uncached prompt tokens estimated while waiting

	// Progress, published to the request's handler.
	produced atomic.Int32
	cached   atomic.Int32
	admitted atomic.Int64 // unix ns
	firstAt  atomic.Int64 // unix ns
	doneAt   atomic.Int64 // unix ns
	err      error        // written before finished is set
	finished atomic.Bool
	aborted  atomic.Bool
}

// rankStats are a rank's cumulative counters; a restart resets them.
type rankStats struct {
	promptTokens    int64
	cachedTokens    int64
	prefillUncached int64
	prefillBusy     time.Duration
	genTokens       int64
	// Generation throughput over roughly one-second windows of the engine's clock.
	tpStart  time.Time
	tpTokens int64
	tpLast   float64
}

// rank is one data-parallel rank: a scheduler with its own prefix cache and publishers.
type rank struct {
	e  *Engine
	id int

	mu       sync.Mutex
	cache    *pageCache
	waiting  []*seq
	running  []*seq
	reserved int
	epoch    uint64
	stats    rankStats
	pending  []events.Event

	wake        chan struct{}
	zeroRunning atomic.Int64 // zero-cost requests in flight
	held        atomic.Int64 // requests held by the Hang fault
	transfers   atomic.Int64 // decode requests waiting for their prefill partner

	kvpub   *eventPublisher
	loadpub *zmtpPub
}

func newRank(e *Engine, id int) *rank {
	return &rank{e: e, id: id, cache: newPageCache(e.cfg.PageSize), wake: make(chan struct{}, 1)}
}

// submit queues seqs for scheduling, or runs them at once in zero-cost mode.
func (r *rank) submit(seqs []*seq) {
	now := r.e.clock.Now()
	if r.e.cfg.ZeroCost {
		r.runInline(seqs, now)
		return
	}
	r.mu.Lock()
	for _, s := range seqs {
		s.state = stWaiting
		s.estUncached = len(s.prompt) - r.matchablePages(s, r.cache.match(s.hashes))*r.cache.pageSize
		r.waiting = append(r.waiting, s)
	}
	r.mu.Unlock()
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// matchablePages limits a prefix match so at least one prompt token is computed.
func (r *rank) matchablePages(s *seq, matched int) int {
	return min(matched, (len(s.prompt)-1)/r.cache.pageSize)
}

// run is the rank's scheduler loop: admit, then one prefill batch or one decode step per
// iteration, sleeping the step's simulated cost on the engine's clock.
func (r *rank) run(ctx context.Context) {
	var batch []*seq
	costs, speedup := *r.e.cfg.Costs, r.e.cfg.Speedup
	var due time.Time // when the last step was due to end; zero after an idle wait
	for {
		now := r.e.clock.Now()
		r.mu.Lock()
		r.reap(now)
		batch = r.admit(batch[:0], now)
		var cost time.Duration
		decoding := 0
		if len(batch) > 0 {
			uncached := 0
			for _, s := range batch {
				uncached += len(s.prompt) - int(s.cached.Load())
			}
			cost = costs.PrefillOverhead + time.Duration(uncached)*costs.PrefillPerToken
		} else {
			for _, s := range r.running {
				if s.state == stRunning {
					decoding++
				}
			}
			cost = costs.DecodeStep + time.Duration(decoding)*costs.DecodePerRequest
		}
		r.flushEvents(now)
		epoch := r.epoch
		r.mu.Unlock()

		if len(batch) == 0 && decoding == 0 {
			due = time.Time{}
			select {
			case <-r.wake:
				continue
			case <-ctx.Done():
				return
			}
		}
		start := stepStart(now, due)
		due = start.Add(time.Duration(float64(cost) / speedup))
		if !r.e.sleep(ctx, due.Sub(r.e.clock.Now())) {
			return
		}
		end := r.e.clock.Now()
		r.mu.Lock()
		if r.epoch == epoch { // a restart during the step discarded it
			if len(batch) > 0 {
				r.prefillDone(batch, end, end.Sub(start))
			} else {
				r.decodeStep(end)
			}
			r.compact()
			r.flushEvents(end)
		}
		r.mu.Unlock()
	}
}

// maxStepLag is the longest delay of a step's start that the next step makes up for (see
// stepStart): a longer one is a stall (or a clock moved by hand), after which the engine
// goes on at its own pace instead of running a burst of steps without sleeping.
const maxStepLag = 50 * time.Millisecond

// stepStart is when a step beginning at now counts as started: at due, the end the step
// before it was due at, when that step's timer fired late by at most maxStepLag (a busy host
// wakes a sleeper late, and at a speedup of 4 a decode step sleeps 2 ms, so 0.5 ms late each
// time costs a fifth of the engine's decode rate), so that back-to-back steps keep the cost
// model's rate. Otherwise, and after an idle wait (due zero), it is now.
func stepStart(now, due time.Time) time.Time {
	if due.IsZero() || !due.Before(now) || now.Sub(due) > maxStepLag {
		return now
	}
	return due
}

// reap finishes aborted sequences that are waiting or running between steps.
func (r *rank) reap(now time.Time) {
	n := 0
	for _, list := range [][]*seq{r.waiting, r.running} {
		for _, s := range list {
			if s.aborted.Load() && s.state != stDone {
				r.finish(s, errAborted, now)
				n++
			}
		}
	}
	if n > 0 {
		r.compact()
	}
}

// compact drops finished sequences from the queues.
func (r *rank) compact() {
	keep := func(list []*seq) []*seq {
		out := list[:0]
		for _, s := range list {
			if s.state != stDone {
				out = append(out, s)
			}
		}
		clear(list[len(out):])
		return out
	}
	r.waiting, r.running = keep(r.waiting), keep(r.running)
}

// admit moves waiting sequences to running, first come first served, while a running slot,
// the prefill token budget and KV capacity (after evicting unreferenced pages) allow. It
// returns the new prefill batch (empty on a decode engine, whose prompts arrive with KV).
func (r *rank) admit(batch []*seq, now time.Time) []*seq {
	budget := r.e.cfg.MaxPrefillTokens
	admitted := 0
	for len(r.waiting) > 0 && len(r.running) < r.e.cfg.MaxRunning {
		s := r.waiting[0]
		uncached, ok := r.tryAdmit(s, budget, admitted == 0)
		if !ok {
			break
		}
		admitted++
		r.waiting[0] = nil
		r.waiting = r.waiting[1:]
		s.admitted.Store(now.UnixNano())
		r.running = append(r.running, s)
		if s.state == stPrefill {
			batch = append(batch, s)
			budget -= uncached
		} else if s.maxTokens == 0 {
			r.finish(s, nil, now)
		}
	}
	return batch
}

// tryAdmit references s's cached prefix and reserves KV for the rest of its prompt and its
// output. It fails, changing nothing, when the prefill budget or the capacity does not allow.
func (r *rank) tryAdmit(s *seq, budget int, first bool) (uncached int, ok bool) {
	ps := r.cache.pageSize
	matched := 0
	awaitsKV := s.job.awaitsKV()
	if !awaitsKV {
		matched = r.matchablePages(s, r.cache.match(s.hashes))
	}
	uncached = len(s.prompt) - matched*ps
	if awaitsKV {
		uncached = 0 // the prompt's KV arrives from the prefill engine
	}
	if !first && uncached > budget {
		return 0, false
	}
	s.path = r.cache.lockPath(s.path[:0], s.hashes[:matched])
	need := len(s.prompt) - matched*ps + s.maxTokens
	if !r.makeRoom(need) {
		r.cache.unlockPath(s.path)
		s.path = s.path[:0]
		return 0, false
	}
	s.reserve = need
	r.reserved += need
	s.cached.Store(int32(matched * ps))
	r.stats.promptTokens += int64(len(s.prompt))
	r.stats.cachedTokens += int64(matched * ps)
	if awaitsKV {
		s.state = stRunning
	} else {
		s.state = stPrefill
	}
	return uncached, true
}

// makeRoom evicts least recently used unreferenced pages until need more tokens fit, and
// reports whether they do. Evictions are published as one BlockRemoved event.
func (r *rank) makeRoom(need int) bool {
	removed, ok := r.cache.evictFor(nil, r.reserved, need, r.e.cfg.CacheTokens)
	if len(removed) > 0 {
		r.pending = append(r.pending, events.Event{Kind: events.EventBlockRemoved, BlockHashes: removed, Medium: events.MediumGPU})
	}
	return ok
}

// prefillDone completes a prefill batch: the prompts' pages enter the cache and each
// sequence has its first token.
func (r *rank) prefillDone(batch []*seq, now time.Time, busy time.Duration) {
	uncached := int64(0)
	for _, s := range batch {
		if s.state != stPrefill {
			continue
		}
		uncached += int64(len(s.prompt)) - int64(s.cached.Load())
		r.insertPrompt(s)
		s.state = stRunning
		if s.maxTokens > 0 {
			s.produced.Store(1)
			s.firstAt.Store(now.UnixNano())
			r.countTokens(1, now)
		}
		if int(s.produced.Load()) >= s.maxTokens {
			r.finish(s, nil, now)
		} else {
			r.notify(s)
		}
	}
	r.stats.prefillUncached += uncached
	if uncached > 0 {
		r.stats.prefillBusy += max(busy, time.Microsecond)
	}
}

// decodeStep gives every decoding sequence one more token.
func (r *rank) decodeStep(now time.Time) {
	n := 0
	for _, s := range r.running {
		if s.state != stRunning {
			continue
		}
		p := s.produced.Add(1)
		n++
		if p == 1 {
			s.firstAt.Store(now.UnixNano())
		}
		if int(p) >= s.maxTokens {
			r.finish(s, nil, now)
		} else {
			r.notify(s)
		}
	}
	r.countTokens(n, now)
}

func (r *rank) countTokens(n int, now time.Time) {
	st := &r.stats
	st.genTokens += int64(n)
	st.tpTokens += int64(n)
	if st.tpStart.IsZero() {
		st.tpStart = now
	}
	if el := now.Sub(st.tpStart); el >= time.Second {
		st.tpLast = float64(st.tpTokens) / el.Seconds()
		st.tpStart, st.tpTokens = now, 0
	}
}

// insertPrompt adds the prompt's whole pages to the cache under the sequence's matched
// prefix, referenced by it, and publishes the new ones as one BlockStored event.
func (r *rank) insertPrompt(s *seq) {
	ps := r.cache.pageSize
	have := len(s.path)
	var parent *page
	if have > 0 {
		parent = s.path[have-1]
	}
	newFrom := -1
	for i := have; i < len(s.hashes); i++ {
		p, isNew := r.cache.insert(parent, s.hashes[i])
		if isNew && newFrom < 0 {
			newFrom = i
		}
		s.path = append(s.path, p)
		parent = p
	}
	covered := (len(s.hashes) - have) * ps
	s.reserve -= covered
	r.reserved -= covered
	if newFrom >= 0 {
		var parentHash int64
		if newFrom > 0 {
			parentHash = s.hashes[newFrom-1]
		}
		r.storedEvent(s.hashes[newFrom:], s.prompt[newFrom*ps:len(s.hashes)*ps], parentHash, newFrom > 0)
	}
}

// insertOutput adds the whole pages of prompt plus output beyond the prompt's pages.
func (r *rank) insertOutput(s *seq) {
	ps := r.cache.pageSize
	n := int(s.produced.Load())
	have := len(s.path)
	full := (len(s.prompt) + n) / ps
	if have != len(s.hashes) || full <= have {
		return
	}
	tail := make([]uint32, 0, (full-have)*ps)
	tail = append(tail, s.prompt[have*ps:]...)
	for i := 0; len(tail) < cap(tail); i++ {
		tail = append(tail, r.e.words.token(s.seed, i).id)
	}
	var pd *hashing.Digest
	if have > 0 {
		pd = &s.last
	}
	hashes, _ := hashing.AppendChainHashes(make([]int64, 0, full-have), pd, tail, ps)
	var parent *page
	if have > 0 {
		parent = s.path[have-1]
	}
	newFrom := -1
	for i, h := range hashes {
		p, isNew := r.cache.insert(parent, h)
		if isNew && newFrom < 0 {
			newFrom = i
		}
		s.path = append(s.path, p)
		parent = p
	}
	if newFrom >= 0 {
		var parentHash int64
		switch {
		case newFrom > 0:
			parentHash = hashes[newFrom-1]
		case have > 0:
			parentHash = s.hashes[have-1]
		}
		r.storedEvent(hashes[newFrom:], tail[newFrom*ps:], parentHash, have+newFrom > 0)
	}
}

// storedEvent queues a BlockStored event.
func (r *rank) storedEvent(hashes []int64, tokens []uint32, parent int64, hasParent bool) {
	r.pending = append(r.pending, events.Event{
		Kind: events.EventBlockStored, BlockHashes: hashes, TokenIDs: tokens, BlockSize: r.cache.pageSize,
		ParentHash: parent, HasParent: hasParent, Medium: events.MediumGPU,
	})
}

// finish ends a sequence: on success its output pages enter the cache (plain engines), its
// pages and reservation are released, and its handler is woken. The caller compacts the
// queues.
func (r *rank) finish(s *seq, err error, now time.Time) {
	if s.state == stDone {
		return
	}
	if err == nil && r.e.cfg.Role == RolePlain && s.state != stWaiting {
		r.insertOutput(s)
	}
	r.cache.unlockPath(s.path)
	s.path = nil
	r.reserved -= s.reserve
	s.reserve = 0
	r.complete(s, err, now)
}

// complete publishes a sequence's end to its handler and, on a prefill engine, to the
// bootstrap room.
func (r *rank) complete(s *seq, err error, now time.Time) {
	s.state = stDone
	s.err = err
	s.doneAt.Store(now.UnixNano())
	s.finished.Store(true)
	if s.hasRoom && r.e.rooms != nil {
		if err == nil {
			r.e.rooms.complete(s.room, roomInfo{PromptTokens: len(s.prompt), CachedTokens: int(s.cached.Load()),
				TransferBackend: r.e.cfg.TransferBackend})
		} else {
			r.e.rooms.fail(s.room, err.Error())
		}
	}
	r.notify(s)
}

func (r *rank) notify(s *seq) {
	select {
	case s.job.notify <- struct{}{}:
	default:
	}
}

// runInline runs sequences to completion at once, for zero-cost mode: admission, prefill and
// every decode step in one critical section.
func (r *rank) runInline(seqs []*seq, now time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, s := range seqs {
		if _, ok := r.tryAdmit(s, r.e.cfg.MaxPrefillTokens, true); !ok {
			// Only a request larger than the whole cache gets here; requests are validated
			// against it, so this is a broken invariant.
			panic("BUG: mockengine: zero-cost request does not fit an empty cache")
		}
		s.admitted.Store(now.UnixNano())
		uncached := len(s.prompt) - int(s.cached.Load())
		if s.state == stPrefill {
			r.insertPrompt(s)
			r.stats.prefillUncached += int64(uncached)
			if uncached > 0 {
				r.stats.prefillBusy += time.Microsecond
			}
			s.state = stRunning
		}
		if s.maxTokens > 0 {
			s.produced.Store(int32(s.maxTokens))
			s.firstAt.Store(now.UnixNano())
			r.countTokens(s.maxTokens, now)
		}
		r.finish(s, nil, now)
	}
	r.flushEvents(now)
}

// flushEvents publishes the pending events as one batch.
func (r *rank) flushEvents(now time.Time) {
	if len(r.pending) == 0 {
		return
	}
	b := events.EventBatch{TS: float64(now.UnixNano()) / 1e9, Events: r.pending, DPRank: r.id, HasDPRank: true}
	if r.kvpub != nil {
		r.kvpub.publish(&b)
	}
	clear(r.pending)
	r.pending = r.pending[:0]
}

// flush empties the cache when nothing is queued or running, publishing AllBlocksCleared.
func (r *rank) flush(now time.Time) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.waiting)+len(r.running) > 0 {
		return false
	}
	r.cache.clear()
	r.pending = append(r.pending, events.Event{Kind: events.EventAllBlocksCleared})
	r.flushEvents(now)
	return true
}

// restart fails every queued and running sequence, drops every connection of the rank's
// ZMQ sockets, empties the cache, resets the counters and the event sequence, and publishes
// AllBlocksCleared as a fresh engine does. The drop comes first, under the mutex that
// serializes publishing, so that no connection from before the restart carries a batch of
// the new run.
func (r *rank) restart(now time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.epoch++
	if r.kvpub != nil {
		r.kvpub.dropPeers()
	}
	if r.loadpub != nil {
		r.loadpub.DropPeers()
	}
	for _, list := range [][]*seq{r.waiting, r.running} {
		for _, s := range list {
			if s.state != stDone {
				s.path, s.reserve = nil, 0
				r.complete(s, errRestarted, now)
			}
		}
	}
	clear(r.waiting)
	clear(r.running)
	r.waiting, r.running, r.reserved = r.waiting[:0], r.running[:0], 0
	r.cache.clear()
	r.stats = rankStats{}
	clear(r.pending)
	r.pending = r.pending[:0]
	if r.kvpub != nil {
		r.kvpub.reset()
	}
	r.pending = append(r.pending, events.Event{Kind: events.EventAllBlocksCleared})
	r.flushEvents(now)
}

// report is the rank's load as the engine reports it.
func (r *rank) report(now time.Time) (load.RankReport, rankExtra) {
	r.mu.Lock()
	defer r.mu.Unlock()
	private := 0
	for _, s := range r.running {
		switch s.state {
		case stPrefill:
			private += len(s.prompt) - int(s.cached.Load())
		case stRunning:
			private += len(s.prompt) - len(s.path)*r.cache.pageSize + int(s.produced.Load())
		}
	}
	waitingUncached := 0
	for _, s := range r.waiting {
		waitingUncached += s.estUncached
	}
	running := int64(len(r.running)) + r.zeroRunning.Load() + r.held.Load()
	used := int64(r.cache.tokens - r.cache.evictable + private)
	rep := load.RankReport{
		DPRank:                r.id,
		Fields:                load.HasRunning | load.HasWaiting | load.HasUsedTokens | load.HasWaitingUncached | load.HasCapacity | load.HasNative,
		Running:               running,
		Waiting:               int64(len(r.waiting)) + r.transfers.Load(),
		UsedTokens:            used,
		MaxTotalTokens:        int64(r.e.cfg.CacheTokens),
		WaitingUncachedTokens: int64(waitingUncached),
		TotalTokens:           int64(r.cache.tokens + private),
		MaxRunningRequests:    int64(r.e.cfg.MaxRunning),
		HasCounters:           true,
		TotalPrefillUncached:  r.stats.prefillUncached,
		TotalPrefillBusyUs:    r.stats.prefillBusy.Microseconds(),
		At:                    now,
	}
	x := rankExtra{genThroughput: r.stats.tpLast, transfers: r.transfers.Load(), queued: int64(len(r.waiting)),
		promptTokens: r.stats.promptTokens, cachedTokens: r.stats.cachedTokens, genTokens: r.stats.genTokens}
	if r.stats.promptTokens > 0 {
		x.cacheHitRate = float64(r.stats.cachedTokens) / float64(r.stats.promptTokens)
	}
	x.utilization = float64(running) / float64(r.e.cfg.MaxRunning)
	return rep, x
}

// rankExtra are the /v1/loads fields RankReport does not carry.
type rankExtra struct {
	genThroughput float64
	cacheHitRate  float64
	utilization   float64
	transfers     int64
	queued        int64
	// Cumulative since start (or restart): prompt tokens, their cached part, output tokens.
	promptTokens, cachedTokens, genTokens int64
}
