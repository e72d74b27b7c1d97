package workload

import (
	"container/list"
	"fmt"

	"switchyard/kv/hashing"
)

// OracleResult is the best achievable prefix-cache outcome of a request sequence.
type OracleResult struct {
	// Requests is the number of requests considered.
	Requests int `json:"requests"`
	// PromptTokens is the sum of their prompt lengths.
	PromptTokens int64 `json:"prompt_tokens"`
	// CachedTokens is the sum of the prompt tokens an ideal placement serves from cache.
	CachedTokens int64 `json:"cached_tokens"`
	// HitRate is CachedTokens / PromptTokens (0 without prompt tokens).
	HitRate float64 `json:"hit_rate"`
	// Pooled, on a FleetOracle's result, is Oracle of the same requests over the fleet's
	// total capacity: the pooled upper bound, which no placement reaches on separate engines.
	Pooled *OracleResult `json:"pooled,omitempty"`
	// NoQueue, on the trace scenario's oracle (the holder placement on simulated engines
	// that queue, mockengine.Simulate), is FleetOracle of the same requests: the same
	// engines serving every request on arrival, without a queue.
	NoQueue *OracleResult `json:"no_queue,omitempty"`
}

// Oracle bounds the cache hit rate any router can reach on reqs, sent in order, over engines
// whose caches hold capacityTokens tokens in all, in pages of pageSize tokens: the pooled
// bound.
//
// It runs one pooled prefix cache of that total capacity that every request reaches: a
// request hits its longest cached prefix of whole pages, less the last prompt token, which an
// engine always computes (as the mock engine and SGLang do), and then stores its prompt's
// whole pages; the least recently used pages are evicted beyond capacity, leaves before their
// parents. A router that splits the traffic over several engines can at best keep every
// request on the engine holding its prefix, which is this pooled cache, less what it leaves
// out: each engine's own capacity, output pages (the workloads never reuse them, but engines
// cache them) and the running requests' KV reservations. FleetOracle counts those for a
// replayed workload; it stays below this bound unless an access pattern defeats LRU (a
// cycle longer than the pooled cache, which separate engines may partly keep).
func Oracle(reqs []Request, tok Templater, pageSize, capacityTokens int) (OracleResult, error) {
	if pageSize < 1 {
		return OracleResult{}, fmt.Errorf("cannot compute oracle: %w: page size %d", ErrInvalidConfig, pageSize)
	}
	if capacityTokens < pageSize {
		return OracleResult{}, fmt.Errorf("cannot compute oracle: %w: capacity %d tokens is below one page (%d)", ErrInvalidConfig, capacityTokens, pageSize)
	}
	c := newPooledCache(capacityTokens / pageSize)
	return runOracle(reqs, tok, pageSize, func(_ int, hashes []int64, promptLen int) int {
		return CachedTokens(c.access(hashes), promptLen, pageSize)
	})
}

// runOracle sends reqs in order to serve, each as the hashes of its prompt's whole pages and
// its length, and sums the prompt tokens and the cached tokens serve returns.
func runOracle(reqs []Request, tok Templater, pageSize int, serve func(i int, hashes []int64, promptLen int) int) (OracleResult, error) {
	var res OracleResult
	hashes := make([]int64, 0, 1024)
	for i := range reqs {
		prompt, err := reqs[i].Prompt(tok)
		if err != nil {
			return OracleResult{}, fmt.Errorf("cannot compute oracle: %w", err)
		}
		full := len(prompt) / pageSize
		hashes = hashing.AppendBlockHashes(hashes[:0], prompt[:full*pageSize], pageSize)
		res.PromptTokens += int64(len(prompt))
		res.CachedTokens += int64(serve(i, hashes, len(prompt)))
		res.Requests++
	}
	if res.PromptTokens > 0 {
		res.HitRate = float64(res.CachedTokens) / float64(res.PromptTokens)
	}
	return res, nil
}

// CachedTokens is what an engine serves from cache for a prompt of promptLen tokens whose
// first matchedPages whole pages are cached: at least one prompt token is always computed.
func CachedTokens(matchedPages, promptLen, pageSize int) int {
	if promptLen < 1 || pageSize < 1 {
		return 0
	}
	return min(matchedPages, (promptLen-1)/pageSize) * pageSize
}

// pooledCache is a page-granular LRU prefix cache. Every page's parent is more recently used
// than the page (access touches a path from its leaf up to its root), so the least recently
// used page is always a leaf and eviction never orphans a cached page.
type pooledCache struct {
	capacity int // pages
	lru      *list.List
	pages    map[int64]*list.Element
}

func newPooledCache(capacity int) *pooledCache {
	return &pooledCache{capacity: capacity, lru: list.New(), pages: make(map[int64]*list.Element)}
}

// access returns how many leading pages of hashes were cached, then stores all of them as
// most recently used and evicts beyond capacity.
func (c *pooledCache) access(hashes []int64) (matched int) {
	for matched < len(hashes) {
		if _, ok := c.pages[hashes[matched]]; !ok {
			break
		}
		matched++
	}
	for i := len(hashes) - 1; i >= 0; i-- {
		if e, ok := c.pages[hashes[i]]; ok {
			c.lru.MoveToFront(e)
		} else {
			c.pages[hashes[i]] = c.lru.PushFront(hashes[i])
		}
	}
	for c.lru.Len() > c.capacity {
		e := c.lru.Back()
		delete(c.pages, e.Value.(int64))
		c.lru.Remove(e)
	}
	return matched
}
