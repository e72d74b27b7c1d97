package mockengine

// page is one cached KV page (block): a node of the prefix tree, keyed by its chained hash.
type page struct {
	hash       int64
	parent     *page
	children   int
	refs       int
	prev, next *page // the LRU list of unreferenced pages, when listed
	listed     bool
	released   int64 // pageCache.now when last listed
}

// pageCache is a paged prefix cache: a tree of pages keyed by their chained block hashes.
// Pages are referenced along whole root paths by the requests using them; an unreferenced
// page is evictable. The LRU list holds exactly the unreferenced pages, in the order they
// became unreferenced, children before parents (paths are released leaf first), so its
// front is always the least recently used evictable leaf.
//
// It is not safe for concurrent use; the rank's mutex guards it.
type pageCache struct {
	pageSize  int
	pages     map[int64]*page
	lru       page  // sentinel: lru.next is the front (oldest)
	tokens    int   // tokens of every page in the tree
	evictable int   // tokens of unreferenced pages
	now       int64 // the owner's time, stamped on a page when it is listed (the simulation's; 0 on an engine)
}

func newPageCache(pageSize int) *pageCache {
	c := &pageCache{pageSize: pageSize, pages: make(map[int64]*page)}
	c.lru.next, c.lru.prev = &c.lru, &c.lru
	return c
}

// match returns the number of leading hashes whose pages are cached.
func (c *pageCache) match(hashes []int64) int {
	for i, h := range hashes {
		if _, ok := c.pages[h]; !ok {
			return i
		}
	}
	return len(hashes)
}

// lockPath references the cached pages of hashes[:n], which must all be cached, and
// appends them to path.
func (c *pageCache) lockPath(path []*page, hashes []int64) []*page {
	for _, h := range hashes {
		p := c.pages[h]
		if p == nil {
			panic("BUG: mockengine: lockPath on a page that is not cached")
		}
		c.ref(p)
		path = append(path, p)
	}
	return path
}

// unlockPath releases a root path, leaf first, so parents are listed after their children.
func (c *pageCache) unlockPath(path []*page) {
	for i := len(path) - 1; i >= 0; i-- {
		c.unref(path[i])
	}
}

func (c *pageCache) ref(p *page) {
	p.refs++
	if p.refs == 1 && p.listed {
		c.unlist(p)
		c.evictable -= c.pageSize
	}
}

func (c *pageCache) unref(p *page) {
	if p.refs <= 0 {
		panic("BUG: mockengine: page released more often than referenced")
	}
	p.refs--
	if p.refs == 0 {
		c.list(p)
		c.evictable += c.pageSize
	}
}

func (c *pageCache) list(p *page) {
	p.prev, p.next = c.lru.prev, &c.lru
	p.released = c.now
	c.lru.prev.next = p
	c.lru.prev = p
	p.listed = true
}

func (c *pageCache) unlist(p *page) {
	p.prev.next, p.next.prev = p.next, p.prev
	p.prev, p.next, p.listed = nil, nil, false
}

// insert adds the page hash under parent (nil: a first block), referenced once by the
// caller. It reports whether the page is new; an existing page is referenced instead.
func (c *pageCache) insert(parent *page, hash int64) (*page, bool) {
	if p, ok := c.pages[hash]; ok {
		c.ref(p)
		return p, false
	}
	p := &page{hash: hash, parent: parent, refs: 1}
	if parent != nil {
		parent.children++
	}
	c.pages[hash] = p
	c.tokens += c.pageSize
	return p, true
}

// evictOne removes the least recently used unreferenced leaf and returns its hash.
func (c *pageCache) evictOne() (int64, bool) {
	p := c.lru.next
	if p == &c.lru {
		return 0, false
	}
	if p.children != 0 {
		panic("BUG: mockengine: the LRU front is not a leaf")
	}
	c.unlist(p)
	delete(c.pages, p.hash)
	if p.parent != nil {
		p.parent.children--
	}
	c.tokens -= c.pageSize
	c.evictable -= c.pageSize
	return p.hash, true
}

// evictFor evicts least recently used unreferenced pages until the cached pages, reserved
// tokens and need more fit capacity, or nothing more is evictable. It appends the evicted
// hashes to removed and reports whether they fit.
func (c *pageCache) evictFor(removed []int64, reserved, need, capacity int) ([]int64, bool) {
	for c.tokens+reserved+need > capacity {
		h, ok := c.evictOne()
		if !ok {
			break
		}
		removed = append(removed, h)
	}
	return removed, c.tokens+reserved+need <= capacity
}

// clear drops every page. Pages referenced by running requests must have been released.
func (c *pageCache) clear() {
	clear(c.pages)
	c.lru.next, c.lru.prev = &c.lru, &c.lru
	c.tokens, c.evictable = 0, 0
}
