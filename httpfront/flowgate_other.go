//go:build !unix

package httpfront

import "net"

// watchConn cannot watch a connection on this platform: a queued request's wait is bounded
// by its queue timeout alone.
func watchConn(net.Conn, chan struct{}, chan struct{}) bool { return false }
