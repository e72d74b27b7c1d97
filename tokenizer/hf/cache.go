package hf

import (
	"hash/maphash"
	"strings"
	"sync"
	"sync/atomic"
)

// chunkCache remembers the IDs of recently encoded chunks of text (see Tokenizer's
// documentation for how text is cut into chunks). A chunk's IDs do not depend on what comes
// before or after it, so a conversation that resends its history finds every earlier chunk
// here. It is bounded in bytes (text plus IDs) and evicts the least recently used chunk.
// Safe for concurrent use; lookups of different chunks mostly take different locks.
type chunkCache struct {
	seed   maphash.Seed
	shards [chunkShards]chunkShard
	hits   atomic.Uint64
	misses atomic.Uint64
}

const chunkShards = 16

type chunkShard struct {
	mu    sync.Mutex
	m     map[uint64]*chunkEntry
	lru   chunkEntry // sentinel: lru.next is the most recently used entry
	bytes int64
	limit int64
}

type chunkEntry struct {
	key        uint64
	text       string
	ids        []uint32 // never modified after insertion
	prev, next *chunkEntry
}

// chunkOverhead approximates the bookkeeping bytes of one entry.
const chunkOverhead = 96

func newChunkCache(limit int64) *chunkCache {
	c := &chunkCache{seed: maphash.MakeSeed()}
	for i := range c.shards {
		s := &c.shards[i]
		s.m = make(map[uint64]*chunkEntry)
		s.lru.next, s.lru.prev = &s.lru, &s.lru
		s.limit = limit / chunkShards
	}
	return c
}

func (e *chunkEntry) size() int64 { return int64(len(e.text)+4*len(e.ids)) + chunkOverhead }

// get returns the IDs of text, which the caller must not modify.
func (c *chunkCache) get(text string) ([]uint32, bool) {
	key := maphash.String(c.seed, text)
	s := &c.shards[key%chunkShards]
	s.mu.Lock()
	e, ok := s.m[key]
	if ok && e.text == text {
		s.unlink(e)
		s.pushFront(e)
		s.mu.Unlock()
		c.hits.Add(1)
		return e.ids, true
	}
	s.mu.Unlock()
	c.misses.Add(1)
	return nil, false
}

// put records the IDs of text, copying both.
func (c *chunkCache) put(text string, ids []uint32) {
	e := &chunkEntry{text: strings.Clone(text), ids: append([]uint32(nil), ids...)}
	e.key = maphash.String(c.seed, text)
	s := &c.shards[e.key%chunkShards]
	if e.size() > s.limit {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if old, ok := s.m[e.key]; ok {
		s.unlink(old)
		s.bytes -= old.size()
	}
	s.m[e.key] = e
	s.pushFront(e)
	s.bytes += e.size()
	for s.bytes > s.limit {
		last := s.lru.prev
		s.unlink(last)
		delete(s.m, last.key)
		s.bytes -= last.size()
	}
}

func (s *chunkShard) unlink(e *chunkEntry) {
	e.prev.next, e.next.prev = e.next, e.prev
}

func (s *chunkShard) pushFront(e *chunkEntry) {
	e.next, e.prev = s.lru.next, &s.lru
	s.lru.next.prev = e
	s.lru.next = e
}

// stats returns the hit and miss counts and the bytes held.
func (c *chunkCache) stats() (hits, misses uint64, bytes int64) {
	for i := range c.shards {
		s := &c.shards[i]
		s.mu.Lock()
		bytes += s.bytes
		s.mu.Unlock()
	}
	return c.hits.Load(), c.misses.Load(), bytes
}
