//go:build !unix

package hangup

import "net"

// watch cannot watch a connection on this platform.
func watch(net.Conn, chan struct{}, chan struct{}, func()) bool { return false }
