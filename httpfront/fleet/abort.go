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

// dispatchMark is what a connection looks for in the first bytes of a request.
var dispatchMark = []byte("\r\n" + HeaderDispatch + ": ")

// maxMarkScan bounds how far into a request's first write the mark is looked for: the
// router sets it among the first headers.
const maxMarkScan = 2048

// Cancel cancels one dispatch. The zero Cancel does nothing.
type Cancel struct{ c *canceler }

// canceler is one cancellable dispatch: the connection it was sent on, once the connection
// has seen its mark, and whether it was cancelled or finished.
type canceler struct {
	u     *Upstream
	id    uint64
	state atomic.Int32 // cancelActive, cancelCancelled or cancelFinished
	conn  atomic.Pointer[upConn]
}

const (
	cancelActive int32 = iota
	cancelCancelled
	cancelFinished
)

// cancels is an Upstream's registry of cancellable dispatches in flight.
type cancels struct {
	next    atomic.Uint64
	pending atomic.Int64 // entries in m: connections look for marks only when some exist
	m       sync.Map     // id → *canceler
}

// Cancellable marks req (before it is sent with Do) as a dispatch that Cancel can stop, and
// returns its Cancel and the func that ends it once the dispatch is over (after Do returns;
// a stream's body is ended by closing it). A cancelled dispatch fails with an *Error; the
// caller knows it cancelled it (Cancelled).
func (u *Upstream) Cancellable(req *fasthttp.Request) (Cancel, func()) {
	c := &canceler{u: u, id: u.cancels.next.Add(1)}
	var buf [20]byte
	req.Header.Set(HeaderDispatch, string(strconv.AppendUint(buf[:0], c.id, 10)))
	u.cancels.m.Store(c.id, c)
	u.cancels.pending.Add(1)
	return Cancel{c}, c.finish
}

// Cancel closes the dispatch's connection, now or as soon as the dispatch is sent on one.
// It does nothing once the dispatch is over.
func (c Cancel) Cancel() {
	if c.c == nil || !c.c.state.CompareAndSwap(cancelActive, cancelCancelled) {
		return
	}
	if uc := c.c.conn.Load(); uc != nil {
		_ = uc.Close()
	}
}

// Cancelled reports whether Cancel stopped the dispatch.
func (c Cancel) Cancelled() bool { return c.c != nil && c.c.state.Load() == cancelCancelled }

func (c *canceler) finish() {
	c.state.CompareAndSwap(cancelActive, cancelFinished)
	if _, ok := c.u.cancels.m.LoadAndDelete(c.id); ok {
		c.u.cancels.pending.Add(-1)
	}
}

// bind records that the dispatch is sent on uc; a dispatch already cancelled closes it.
func (c *canceler) bind(uc *upConn) {
	c.conn.Store(uc)
	if c.state.Load() == cancelCancelled {
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
	if v, ok := cs.m.Load(id); ok {
		v.(*canceler).bind(uc)
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
