//go:build unix

package hangup

import (
	"errors"
	"net"
	"os"
	"syscall"
)

// watch starts a goroutine that closes gone when c's peer closes or resets the
// connection, and closes done when it ends; it reports false (and starts nothing) when c
// gives no access to its socket. The goroutine ends when the peer leaves, when data arrives,
// or when a read deadline passes.
func watch(c net.Conn, gone, done chan struct{}, onGone func()) bool {
	rc := rawConn(c)
	if rc == nil {
		return false
	}
	go func() {
		defer close(done)
		left := false
		var buf [1]byte
		err := rc.Read(func(fd uintptr) bool {
			for {
				n, _, err := syscall.Recvfrom(int(fd), buf[:], syscall.MSG_PEEK)
				switch {
				case err == syscall.EINTR:
					continue
				case err == syscall.EAGAIN || err == syscall.EWOULDBLOCK:
					return false // nothing to read: wait until the socket is readable
				case err != nil || n == 0:
					left = true // reset, or an orderly close
				}
				return true
			}
		})
		if err != nil && !errors.Is(err, os.ErrDeadlineExceeded) {
			left = true // the connection was closed
		}
		if left {
			if onGone != nil {
				onGone()
			}
			close(gone)
		}
	}()
	return true
}

// rawConn returns the socket under c, unwrapping connections that wrap another, or nil.
func rawConn(c net.Conn) syscall.RawConn {
	for range 4 {
		switch v := c.(type) {
		case syscall.Conn:
			rc, err := v.SyscallConn()
			if err != nil {
				return nil
			}
			return rc
		case interface{ NetConn() net.Conn }:
			c = v.NetConn()
		default:
			return nil
		}
	}
	return nil
}
