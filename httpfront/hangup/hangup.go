package hangup

import (
	"net"
	"time"
)

// Watch is one connection's watch for its peer hanging up.
type Watch struct {
	setDeadline func(time.Time) error
	gone        chan struct{}
	done        chan struct{}
}

// Start watches c until Stop; nil, false when c cannot be watched. setReadDeadline (nil:
// c's own) is what Stop moves c's read deadline with, to wake the watch: a connection
// wrapper that defers deadlines must arm one in the past at once. onGone, when set, runs on
// the watch's goroutine when the peer hangs up, before Gone is closed; Stop waits for it.
func Start(c net.Conn, setReadDeadline func(time.Time) error, onGone func()) (*Watch, bool) {
	if setReadDeadline == nil {
		setReadDeadline = c.SetReadDeadline
	}
	w := &Watch{setDeadline: setReadDeadline, gone: make(chan struct{}), done: make(chan struct{})}
	if !watch(c, w.gone, w.done, onGone) {
		return nil, false
	}
	return w, true
}

// Gone is closed when the peer has closed or reset the connection.
func (w *Watch) Gone() <-chan struct{} { return w.gone }

// Left reports whether the peer has hung up.
func (w *Watch) Left() bool {
	select {
	case <-w.gone:
		return true
	default:
		return false
	}
}

// Stop ends the watch and waits for its goroutine; the connection's read deadline is
// cleared afterwards. Call it once, before anything else reads from the connection.
func (w *Watch) Stop() {
	_ = w.setDeadline(time.Unix(1, 0))
	<-w.done
	_ = w.setDeadline(time.Time{})
}
