package fleet

import (
	"bytes"
	"context"
	"encoding/json"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"

	"switchyard/config"
	"switchyard/load"
)

// Stopping an engine's work: a dispatch can be cancelled, which closes the connection it
// was sent on (an engine that watches its connections, vLLM, aborts the request; the
// dispatch fails at once), and an engine with an abort API (SGLang's POST /abort_request)
// can be told to abort a request by its rid.

// HeaderDispatch names the request header that tells a cancellable dispatch's connection
// which dispatch it carries. Engines ignore it.
const HeaderDispatch = "X-Switchyard-Dispatch"

// PathAbort is SGLang's abort route.
const PathAbort = "/abort_request"

// keyDispatch is HeaderDispatch, set under its canonical name without normalizing it again.
var keyDispatch = []byte(HeaderDispatch)

// dispatchMark is what a connection looks for in the first bytes of a request.
var dispatchMark = []byte("\r\n" + HeaderDispatch + ": ")

// maxMarkScan bounds how far into a request's first write the mark is looked for: the
// router sets it among the first headers.
const maxMarkScan = 2048

// Cancel cancels one dispatch. The zero Cancel does nothing.
type Cancel struct {
	c   *canceler
	gen uint64 // the canceler's generation for this dispatch
}

// canceler is one cancellable dispatch: the connection it was sent on, once the connection
// has seen its mark, and whether it was cancelled or finished. A canceler that finished
// without a cancel is reused (cancelerPool) under a new generation: a Cancel kept after its
// dispatch's end compares its generation and touches nothing. A cancelled one is never
// reused, so that Cancelled stays true after the end.
type canceler struct {
	u     *Upstream
	id    atomic.Uint64 // read by connections looking up marks while it may be reused
	state atomic.Uint64 // generation<<2 | cancelActive, cancelCancelled or cancelFinished
	conn  atomic.Pointer[upConn]
}

const (
	cancelActive uint64 = iota
	cancelCancelled
	cancelFinished
	cancelMask uint64 = 3
)

var cancelerPool = sync.Pool{New: func() any { return new(canceler) }}

// cancelSlots is the size of an Upstream's table of cancellable dispatches. A power of two.
const cancelSlots = 1 << 10

// cancels is an Upstream's registry of cancellable dispatches in flight: dispatch id's
// slot in a table (id modulo its size, claimed and cleared with one compare-and-swap: no
// lock and no allocation), or, when a dispatch still holds that slot (more than
// cancelSlots ids ago), a map.
type cancels struct {
	next    atomic.Uint64
	pending atomic.Int64 // registered dispatches: connections look for marks only when some exist
	tab     [cancelSlots]atomic.Pointer[canceler]
	m       sync.Map // id → *canceler, for ids whose slot was taken
}

// add registers c under id.
func (cs *cancels) add(id uint64, c *canceler) {
	if !cs.tab[id&(cancelSlots-1)].CompareAndSwap(nil, c) {
		cs.m.Store(id, c) // slow path: the slot is held
	}
	cs.pending.Add(1)
}

// lookup returns the dispatch registered under id, or nil.
func (cs *cancels) lookup(id uint64) *canceler {
	if c := cs.tab[id&(cancelSlots-1)].Load(); c != nil && c.id.Load() == id {
		return c
	}
	if v, ok := cs.m.Load(id); ok {
		return v.(*canceler)
	}
	return nil
}

// remove unregisters c, registered under id.
func (cs *cancels) remove(id uint64, c *canceler) {
	if cs.tab[id&(cancelSlots-1)].CompareAndSwap(c, nil) {
		cs.pending.Add(-1)
		return
	}
	if _, ok := cs.m.LoadAndDelete(id); ok {
		cs.pending.Add(-1)
	}
}

// Cancellable marks req (before it is sent with Do) as a dispatch that Cancel can stop, and
// returns its Cancel; End ends it once the dispatch is over (after Do returns; a stream's
// body is ended by closing it). A cancelled dispatch fails with an *Error; the caller knows
// it cancelled it (Cancelled).
func (u *Upstream) Cancellable(req *fasthttp.Request) Cancel {
	c := cancelerPool.Get().(*canceler)
	id := u.cancels.next.Add(1)
	c.u = u
	c.id.Store(id)
	c.conn.Store(nil)
	gen := c.state.Load()&^cancelMask + 1<<2
	c.state.Store(gen | cancelActive)
	var buf [20]byte
	req.Header.SetCanonical(keyDispatch, strconv.AppendUint(buf[:0], id, 10))
	u.cancels.add(id, c)
	return Cancel{c: c, gen: gen}
}

// Cancel closes the dispatch's connection, now or as soon as the dispatch is sent on one.
// It does nothing once the dispatch is over.
func (c Cancel) Cancel() {
	if c.c == nil || !c.c.state.CompareAndSwap(c.gen|cancelActive, c.gen|cancelCancelled) {
		return
	}
	if uc := c.c.conn.Load(); uc != nil {
		_ = uc.Close()
	}
}

// Cancelled reports whether Cancel stopped the dispatch.
func (c Cancel) Cancelled() bool {
	return c.c != nil && c.c.state.Load() == c.gen|cancelCancelled
}

// End ends the dispatch, once, after it is over: it leaves the registry, and a canceler not
// cancelled is reused. The zero Cancel's End does nothing.
func (c Cancel) End() {
	if c.c != nil {
		c.c.finish(c.gen)
	}
}

func (c *canceler) finish(gen uint64) {
	st := c.state.Load()
	if st&^cancelMask != gen {
		return // ended already
	}
	reuse := st&cancelMask == cancelActive && c.state.CompareAndSwap(st, st&^cancelMask|cancelFinished)
	c.u.cancels.remove(c.id.Load(), c)
	if reuse {
		c.u = nil
		c.conn.Store(nil)
		cancelerPool.Put(c)
	}
}

// bind records that the dispatch is sent on uc; a dispatch already cancelled closes it.
func (c *canceler) bind(uc *upConn) {
	c.conn.Store(uc)
	if c.state.Load()&cancelMask == cancelCancelled {
		_ = uc.Close()
	}
}

// bindMarked binds the dispatch whose mark begins b, the first write of a request on uc.
// Slow path only when cancellable dispatches are in flight on the engine.
func (cs *cancels) bindMarked(uc *upConn, b []byte) {
	if cs.pending.Load() == 0 {
		return
	}
	head := b[:min(len(b), maxMarkScan)]
	i := bytes.Index(head, dispatchMark)
	if i < 0 {
		return
	}
	var id uint64
	for _, ch := range head[i+len(dispatchMark):] {
		if ch < '0' || ch > '9' {
			break
		}
		id = id*10 + uint64(ch-'0')
	}
	if c := cs.lookup(id); c != nil {
		c.bind(uc)
	}
}

// AbortsByAPI reports whether the engine is stopped through its abort API rather than by
// closing the connection alone: SGLang engines (flavour sglang, or auto with an
// introspection route) keep generating for a client that has gone. vLLM engines abort a
// request whose connection closes.
func (m *Member) AbortsByAPI() bool {
	switch m.spec.Flavor {
	case config.FlavorSGLang:
		return true
	case config.FlavorVLLM:
		return false
	}
	return m.info.Load() != nil
}

// Abort asks the engine to abort the request rid (SGLang: POST /abort_request {"rid"}),
// bounded by timeout and ctx, on the worker's probe connections.
func (m *Member) Abort(ctx context.Context, rid string, timeout time.Duration) error {
	body, err := json.Marshal(struct {
		Rid string `json:"rid"`
	}{rid})
	if err != nil {
		return err
	}
	return load.Send(ctx, m.up.Probe(), fasthttp.MethodPost, strings.TrimRight(m.url, "/")+PathAbort, body, "application/json",
		timeout, maxInfoBody,
		func(status int, _ []byte) error {
			if status != fasthttp.StatusOK {
				return &errStatus{PathAbort, status}
			}
			return nil
		})
}
