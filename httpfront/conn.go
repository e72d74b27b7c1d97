package httpfront

import (
	"errors"
	"net"
	"os"
	"sync"
	"time"
)

// lazyDeadlineListener hands out lazyDeadlineConns.
type lazyDeadlineListener struct{ net.Listener }

func (l lazyDeadlineListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &lazyDeadlineConn{Conn: c}, nil
}

// lazyDeadlineConn moves its deadlines lazily. fasthttp moves a keep-alive connection's read
// deadline twice per request (the idle timeout, then the read timeout), and every move is a
// runtime timer update: a measurable part of the cost of a small request. Here a deadline
// later than the armed one is only recorded; when the armed deadline fires first, the read or
// write re-arms the recorded deadline and carries on, so an operation still times out exactly
// at the deadline last set. A deadline earlier than the armed one is armed at once.
type lazyDeadlineConn struct {
	net.Conn
	mu   sync.Mutex
	r, w lazyDeadline
}

var _ net.Conn = (*lazyDeadlineConn)(nil)

// lazyDeadline is one direction's deadlines: the one last set and the one armed on the
// connection; zero is none.
type lazyDeadline struct{ want, armed time.Time }

// set records t and reports whether it must be armed now: it is earlier than the armed
// deadline, or none is armed. A later or cleared deadline waits for the armed one to fire.
func (d *lazyDeadline) set(t time.Time) bool {
	d.want = t
	if t.IsZero() || !d.armed.IsZero() && !t.Before(d.armed) {
		return false
	}
	d.armed = t
	return true
}

// fired handles the armed deadline firing and reports whether the operation goes on: the
// deadline last set (or none) is armed, unless it has passed as well.
func (d *lazyDeadline) fired(arm func(time.Time) error) bool {
	if d.want.Equal(d.armed) {
		return false // the deadline last set is the one that fired
	}
	d.armed = d.want
	if err := arm(d.want); err != nil {
		return false
	}
	return d.want.IsZero() || time.Now().Before(d.want)
}

func (c *lazyDeadlineConn) SetReadDeadline(t time.Time) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.r.set(t) {
		return c.Conn.SetReadDeadline(t)
	}
	return nil
}

func (c *lazyDeadlineConn) SetWriteDeadline(t time.Time) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.w.set(t) {
		return c.Conn.SetWriteDeadline(t)
	}
	return nil
}

func (c *lazyDeadlineConn) SetDeadline(t time.Time) error {
	if err := c.SetReadDeadline(t); err != nil {
		return err
	}
	return c.SetWriteDeadline(t)
}

func (c *lazyDeadlineConn) Read(b []byte) (int, error) {
	for {
		n, err := c.Conn.Read(b)
		if n > 0 || !errors.Is(err, os.ErrDeadlineExceeded) {
			return n, err
		}
		c.mu.Lock()
		more := c.r.fired(c.Conn.SetReadDeadline)
		c.mu.Unlock()
		if !more {
			return n, err
		}
	}
}

func (c *lazyDeadlineConn) Write(b []byte) (int, error) {
	done := 0
	for {
		n, err := c.Conn.Write(b[done:])
		done += n
		if err == nil || !errors.Is(err, os.ErrDeadlineExceeded) {
			return done, err
		}
		c.mu.Lock()
		more := c.w.fired(c.Conn.SetWriteDeadline)
		c.mu.Unlock()
		if !more {
			return done, err
		}
	}
}
