package httpfront

import (
	"net"
	"sync"

	"github.com/valyala/fasthttp"
)

// connTracker records the open client connections so that the end of a drain can close
// those still open.
type connTracker struct {
	mu    sync.Mutex
	conns map[net.Conn]struct{}
}

// track is the fasthttp ConnState hook. The active and idle transitions, two per request,
// take no lock.
func (t *connTracker) track(c net.Conn, state fasthttp.ConnState) {
	switch state {
	case fasthttp.StateNew:
		t.mu.Lock()
		if t.conns == nil {
			t.conns = make(map[net.Conn]struct{})
		}
		t.conns[c] = struct{}{}
		t.mu.Unlock()
	case fasthttp.StateClosed, fasthttp.StateHijacked:
		t.mu.Lock()
		delete(t.conns, c)
		t.mu.Unlock()
	}
}

// closeAll closes every open connection.
func (t *connTracker) closeAll() {
	t.mu.Lock()
	defer t.mu.Unlock()
	for c := range t.conns {
		_ = c.Close()
	}
}
