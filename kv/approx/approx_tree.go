package approx

import (
	"container/heap"
	"sync/atomic"

	"switchyard/kv"
)

// approxTree is the approximate prefix tree of one model in one shard: a radix tree over
// symbols (token IDs, or the bytes of a prompt's text) whose nodes record which workers
// (tenants) were sent a prompt running through them, and when. A tenant holding a node
// holds every ancestor of it, so a tenant's match is the depth of the deepest node it holds
// on a prompt's path.
//
// It is owned by one goroutine (its shard's).
type approxTree struct {
	root approxNode
	// tenants maps a tenant index to its worker ID, size (symbols of the nodes it holds in
	// this tree) and the index's resident counter; tenantIdx is the reverse.
	tenants   []approxTenant
	tenantIdx map[string]int
	free      []int // tenant indices released by a removal
	// total is the number of symbols the tree stores (each node's edge counted once).
	total int64
	// nodes counts the tree's nodes, the root excluded.
	nodes int64
	clock uint64
}

// approxTenant is one worker's part of a tree.
type approxTenant struct {
	id       string
	size     int64
	resident *atomic.Int64 // the index-wide count of this worker's symbols
	live     bool
}

// approxNode is one edge of the tree and the tenants holding it.
type approxNode struct {
	edge     []uint32
	parent   *approxNode
	children map[uint32]*approxNode // by the first symbol of the child's edge
	holders  []approxHolder
}

// approxHolder is a tenant holding a node and the logical time it was last sent through it.
type approxHolder struct {
	tenant int
	stamp  uint64
}

func newApproxTree() *approxTree {
	return &approxTree{tenantIdx: map[string]int{}}
}

// tenant returns the index of worker, registering it with its resident counter.
func (t *approxTree) tenant(worker string, resident func(string) *atomic.Int64) int {
	if i, ok := t.tenantIdx[worker]; ok {
		return i
	}
	tn := approxTenant{id: worker, resident: resident(worker), live: true}
	var i int
	if n := len(t.free); n > 0 {
		i = t.free[n-1]
		t.free = t.free[:n-1]
		t.tenants[i] = tn
	} else {
		i = len(t.tenants)
		t.tenants = append(t.tenants, tn)
	}
	t.tenantIdx[worker] = i
	return i
}

func (n *approxNode) holder(tenant int) int {
	for i := range n.holders {
		if n.holders[i].tenant == tenant {
			return i
		}
	}
	return -1
}

// hold marks tenant as holding n at stamp, counting n's symbols to it when it did not hold
// n yet.
func (t *approxTree) hold(n *approxNode, tenant int, stamp uint64) {
	if i := n.holder(tenant); i >= 0 {
		n.holders[i].stamp = stamp
		return
	}
	n.holders = append(n.holders, approxHolder{tenant: tenant, stamp: stamp})
	t.grow(tenant, int64(len(n.edge)))
}

func (t *approxTree) grow(tenant int, by int64) {
	tn := &t.tenants[tenant]
	tn.size += by
	tn.resident.Add(by)
}

// insert records that seq was sent to tenant.
func (t *approxTree) insert(seq []uint32, tenant int) {
	t.clock++
	stamp := t.clock
	n := &t.root
	for i := 0; i < len(seq); {
		child := n.children[seq[i]]
		if child == nil {
			leaf := &approxNode{edge: append([]uint32(nil), seq[i:]...), parent: n}
			if n.children == nil {
				n.children = make(map[uint32]*approxNode, 2)
			}
			n.children[seq[i]] = leaf
			t.total += int64(len(leaf.edge))
			t.nodes++
			t.hold(leaf, tenant, stamp)
			return
		}
		l := commonPrefix(child.edge, seq[i:])
		if l < len(child.edge) {
			child = t.split(child, l)
		}
		t.hold(child, tenant, stamp)
		n = child
		i += l
	}
}

// split cuts n's edge after l symbols: a new node takes the first l symbols, with n's
// holders (each still holds the same symbols), and n keeps the rest below it.
func (t *approxTree) split(n *approxNode, l int) *approxNode {
	mid := &approxNode{edge: n.edge[:l:l], parent: n.parent, holders: append([]approxHolder(nil), n.holders...)}
	mid.children = map[uint32]*approxNode{n.edge[l]: n}
	n.parent.children[n.edge[0]] = mid
	n.edge = n.edge[l:]
	n.parent = mid
	t.nodes++
	return mid
}

func commonPrefix(a, b []uint32) int {
	n := min(len(a), len(b))
	for i := 0; i < n; i++ {
		if a[i] != b[i] {
			return i
		}
	}
	return n
}

// match appends to dst, for every tenant holding a prefix of seq, the length of its longest
// held prefix.
func (t *approxTree) match(seq []uint32, dst []kv.Match) []kv.Match {
	start := len(dst)
	n := &t.root
	depth := 0
	for depth < len(seq) {
		child := n.children[seq[depth]]
		if child == nil {
			break
		}
		l := commonPrefix(child.edge, seq[depth:])
		depth += l
		for _, h := range child.holders {
			id := t.tenants[h.tenant].id
			found := false
			for j := start; j < len(dst); j++ {
				if dst[j].Worker == id {
					dst[j].Tokens = int64(depth)
					found = true
					break
				}
			}
			if !found {
				dst = append(dst, kv.Match{Worker: id, Tokens: int64(depth)})
			}
		}
		if l < len(child.edge) {
			break
		}
		n = child
	}
	return dst
}

// evict trims every tenant to at most budget symbols, least recently sent prefixes first,
// and returns the number of symbols the tree no longer stores.
func (t *approxTree) evict(budget int64) int64 {
	before := t.total
	over := false
	for i := range t.tenants {
		if t.tenants[i].live && t.tenants[i].size > budget {
			over = true
		}
	}
	if !over {
		return 0
	}
	for i := range t.tenants {
		if t.tenants[i].live && t.tenants[i].size > budget {
			t.evictTenant(i, budget)
		}
	}
	return before - t.total
}

// evictTenant releases tenant's least recently used leaves (the nodes it holds below which
// it holds nothing) until it holds at most budget symbols.
func (t *approxTree) evictTenant(tenant int, budget int64) {
	h := &approxHeap{}
	t.walk(&t.root, func(n *approxNode) {
		if n != &t.root && n.holder(tenant) >= 0 && !t.holdsChild(n, tenant) {
			h.items = append(h.items, approxLeaf{n: n, stamp: n.holders[n.holder(tenant)].stamp})
		}
	})
	heap.Init(h)
	for t.tenants[tenant].size > budget && h.Len() > 0 {
		leaf := heap.Pop(h).(approxLeaf).n
		parent := leaf.parent
		t.release(leaf, tenant)
		if parent != &t.root && parent.holder(tenant) >= 0 && !t.holdsChild(parent, tenant) {
			heap.Push(h, approxLeaf{n: parent, stamp: parent.holders[parent.holder(tenant)].stamp})
		}
	}
}

// release takes tenant off n, removing n once nobody holds it (nobody holds its children
// then: a holder of a child holds its parent).
func (t *approxTree) release(n *approxNode, tenant int) {
	i := n.holder(tenant)
	if i < 0 {
		return
	}
	n.holders[i] = n.holders[len(n.holders)-1]
	n.holders = n.holders[:len(n.holders)-1]
	t.grow(tenant, -int64(len(n.edge)))
	if len(n.holders) == 0 {
		t.unlink(n)
	}
}

// unlink removes n (and whatever is left below it) from the tree.
func (t *approxTree) unlink(n *approxNode) {
	delete(n.parent.children, n.edge[0])
	t.walk(n, func(m *approxNode) {
		t.total -= int64(len(m.edge))
		t.nodes--
	})
}

func (t *approxTree) holdsChild(n *approxNode, tenant int) bool {
	for _, c := range n.children {
		if c.holder(tenant) >= 0 {
			return true
		}
	}
	return false
}

// walk calls f on n and every node below it, depth first, without recursion.
func (t *approxTree) walk(n *approxNode, f func(*approxNode)) {
	stack := []*approxNode{n}
	for len(stack) > 0 {
		m := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		f(m)
		for _, c := range m.children {
			stack = append(stack, c)
		}
	}
}

// remove forgets worker: every node it holds is released (and removed when nobody else
// holds it).
func (t *approxTree) remove(worker string) {
	i, ok := t.tenantIdx[worker]
	if !ok {
		return
	}
	var held []*approxNode
	t.walk(&t.root, func(n *approxNode) {
		if n != &t.root && n.holder(i) >= 0 {
			held = append(held, n)
		}
	})
	// Deepest first, so that a node is released after everything below it.
	for j := len(held) - 1; j >= 0; j-- {
		if held[j].parent != nil {
			t.release(held[j], i)
		}
	}
	t.tenants[i].resident.Add(-t.tenants[i].size)
	t.tenants[i] = approxTenant{}
	delete(t.tenantIdx, worker)
	t.free = append(t.free, i)
}

// reset forgets everything, returning each tenant's symbols to the resident counters.
func (t *approxTree) reset() {
	for i := range t.tenants {
		if tn := &t.tenants[i]; tn.live {
			tn.resident.Add(-tn.size)
		}
	}
	*t = *newApproxTree()
}

// approxLeaf is an eviction candidate: a node and its tenant's stamp on it.
type approxLeaf struct {
	n     *approxNode
	stamp uint64
}

// approxHeap orders eviction candidates oldest first.
type approxHeap struct{ items []approxLeaf }

func (h *approxHeap) Len() int           { return len(h.items) }
func (h *approxHeap) Less(i, j int) bool { return h.items[i].stamp < h.items[j].stamp }
func (h *approxHeap) Swap(i, j int)      { h.items[i], h.items[j] = h.items[j], h.items[i] }
func (h *approxHeap) Push(x any)         { h.items = append(h.items, x.(approxLeaf)) }
func (h *approxHeap) Pop() any {
	x := h.items[len(h.items)-1]
	h.items = h.items[:len(h.items)-1]
	return x
}
