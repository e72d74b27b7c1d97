package mockengine

import (
	"math/rand/v2"
	"testing"
)

func TestPageCacheLRUEvictsLeavesFirst(t *testing.T) {
	c := newPageCache(4)
	// Chain a: 1 -> 2 -> 3, chain b: 1 -> 2 -> 4 (shares a's first two pages).
	var pa []*page
	var parent *page
	for _, h := range []int64{1, 2, 3} {
		p, isNew := c.insert(parent, h)
		if !isNew {
			t.Fatalf("page %d not new", h)
		}
		pa, parent = append(pa, p), p
	}
	c.unlockPath(pa)
	pb := c.lockPath(nil, []int64{1, 2})
	p4, _ := c.insert(pb[1], 4)
	pb = append(pb, p4)
	c.unlockPath(pb)
	if c.tokens != 16 || c.evictable != 16 {
		t.Fatalf("tokens %d evictable %d", c.tokens, c.evictable)
	}
	var order []int64
	for {
		h, ok := c.evictOne()
		if !ok {
			break
		}
		order = append(order, h)
	}
	// 3 was released before b's path; 4 next; then 2 and 1 became leaves.
	if want := []int64{3, 4, 2, 1}; !equalInt64(order, want) {
		t.Fatalf("eviction order %v, want %v", order, want)
	}
	if c.tokens != 0 || c.evictable != 0 || len(c.pages) != 0 {
		t.Fatalf("after evicting all: tokens %d evictable %d pages %d", c.tokens, c.evictable, len(c.pages))
	}
}

func TestPageCacheReferencedPagesStay(t *testing.T) {
	c := newPageCache(1)
	p1, _ := c.insert(nil, 1)
	p2, _ := c.insert(p1, 2)
	path := []*page{p1, p2}
	if _, ok := c.evictOne(); ok {
		t.Fatal("evicted a referenced page")
	}
	c.unlockPath(path)
	if h, _ := c.evictOne(); h != 2 {
		t.Fatalf("evicted %d first, want the leaf 2", h)
	}
}

// TestPageCacheRandomOps checks the invariants under random root-path workloads: the LRU
// front is always a leaf, and the token counts match the tree.
func TestPageCacheRandomOps(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	c := newPageCache(2)
	var held [][]*page
	for range 5000 {
		switch rng.IntN(3) {
		case 0: // a request over a random path of a small trie
			depth := 1 + rng.IntN(6)
			hashes := make([]int64, depth)
			h := int64(0)
			for i := range hashes {
				h = h*7 + int64(rng.IntN(3)) + 1
				hashes[i] = h
			}
			m := c.match(hashes)
			path := c.lockPath(nil, hashes[:m])
			var parent *page
			if m > 0 {
				parent = path[m-1]
			}
			for _, x := range hashes[m:] {
				p, _ := c.insert(parent, x)
				path, parent = append(path, p), p
			}
			held = append(held, path)
		case 1:
			if len(held) > 0 {
				i := rng.IntN(len(held))
				c.unlockPath(held[i])
				held = append(held[:i], held[i+1:]...)
			}
		case 2:
			_, _ = c.evictOne()
		}
		evictable := 0
		for _, p := range c.pages {
			if p.refs == 0 {
				evictable += c.pageSize
			}
		}
		if c.tokens != len(c.pages)*c.pageSize || c.evictable != evictable {
			t.Fatalf("tokens %d (pages %d), evictable %d (counted %d)", c.tokens, len(c.pages), c.evictable, evictable)
		}
	}
}

func equalInt64(a, b []int64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
