package httpfront

import (
	"context"
	"log/slog"
	"slices"

	"switchyard/actors"
	"switchyard/config"
	"switchyard/engine"
	"switchyard/kv"
	"switchyard/kv/approx"
	"switchyard/tokenizer"
)

// Cache-aware wiring: the cache state (prefix index and KV-event subscriptions, or the
// remote indexer client) is built by New when a group runs cache_aware (or an affinity
// policy with affinity.prefix_rebind), followed by Run for
// the server's lifetime, told about workers the admin API adds or removes, and asked once
// per request, in the handler goroutine, for the prompt's prefix matches.

// newCacheState builds the cache state when some group's policy is cache_aware, or
// session_aware or sticky with affinity.prefix_rebind, else nil.
func newCacheState(cfg *config.Config, opts Options, sys *actors.System) (*actors.CacheState, error) {
	if !actors.NeedsCache(cfg) {
		return nil, nil
	}
	return actors.NewCacheState(cfg, actors.CacheOptions{Logger: opts.Logger, Metrics: opts.Metrics, System: sys})
}

// defaultCacheTokenizers gives every model whose requests need a prefix lookup and that has
// no tokenizer the built-in one (tokenizer.Simple), which the mock engine uses by default:
// a lookup needs the prompt's token IDs, and the body-size estimate has none. Against real
// engines the built-in tokenizer's IDs match nothing they cache, so every pick falls back on
// load; models.<name>.tokenizer.path names the engine's tokenizer.
func defaultCacheTokenizers(cs *actors.CacheState, toks map[string]*promptTokenizer, logger *slog.Logger) {
	if cs == nil || cs.Approximate() != nil {
		return // the approximate source matches the prompt's text when there is no tokenizer
	}
	names := make([]string, 0, len(toks))
	for name, pt := range toks {
		if pt == nil && cs.NeedsPrefix(name) {
			names = append(names, name)
		}
	}
	if len(names) == 0 {
		return
	}
	slices.Sort(names)
	simple := tokenizer.NewSimple()
	for _, name := range names {
		toks[name] = newPromptTokenizer(simple, false)
		logger.Warn("model needing prefix lookups (cache_aware or affinity.prefix_rebind) has no tokenizer: prompts are tokenized with the built-in tokenizer, "+
			"whose blocks only engines using it (the mock engine) hold; set its tokenizer.path to the engine's tokenizer",
			slog.String("model", name), slog.String("key", config.ModelPath(name)+".tokenizer.path"))
	}
}

// preparePrefix makes the request's one prefix lookup into the exchange's memo, in the
// handler goroutine before any pick: the only place a remote indexer's I/O happens, bounded
// by cache_aware.query_timeout. An unavailable source or a rejected query is recorded in the
// memo; the policy turns them into a miss or an invalid signal.
// The memo answers the policies' prefix questions, and rank dispatch's (which ranks hold it).
var (
	_ engine.PrefixMatcher = (*kv.PrefixMemo)(nil)
	_ engine.RankMatcher   = (*kv.PrefixMemo)(nil)
)

func (s *Server) preparePrefix(ex *exchange, model string, ids []uint32) *kv.PrefixMemo {
	ex.memo.Reset(model, ids)
	s.cache.Resolve(context.Background(), &ex.memo)
	return &ex.memo
}

// approxSymbols appends to dst the symbols the approximate source keys a request without
// token IDs by: the bytes of its text as the client sent it (JSON-escaped; every request
// escapes alike), for a chat each message's role and content in order, otherwise the single
// prompt. A batch has none.
func approxSymbols(dst []uint32, f *requestFacts) []uint32 {
	switch {
	case f.kind == routeChat:
		for _, m := range f.messages {
			_ = m.members(func(key []byte, v jsonValue) error {
				if keyIs(key, "role") || keyIs(key, "content") {
					dst = approx.TextSymbols(dst, v.raw)
				}
				return nil
			})
		}
	case len(f.prompts) == 1 && f.batch == 0:
		dst = approx.TextSymbols(dst, f.prompts[0].raw)
	}
	return dst[:min(len(dst), approx.MaxSymbols)]
}

// recordDispatch tells the approximate source where the request of ex went: its plain or
// prefill engine now holds its prompt. A no-op with another source or without a lookup.
func (s *Server) recordDispatch(ex *exchange, pick *engine.BucketPick) {
	if s.cache == nil || ex.breq.Prefix == nil {
		return
	}
	w := pick.Plain.Worker
	if pick.IsPD() {
		w = pick.Prefill.Worker
	}
	if w != nil {
		s.cache.Record(&ex.memo, w.ID)
	}
}

// Cache returns the router's cache state (prefix source, and with a local source the index
// and its KV-event subscriptions), or nil when no group runs cache_aware.
func (s *Server) Cache() *actors.CacheState { return s.cache }
