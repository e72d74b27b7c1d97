// Package hangup tells when the peer of a connection hangs up while nothing is being read
// from it: a server waiting on an engine for a request whose client has gone, an engine
// whose caller has gone. A watch is one goroutine parked in the runtime's poller on the
// socket; when the socket turns readable it peeks at it without consuming anything: an
// orderly close or a reset is a hang-up; bytes (a pipelined request) end the watch without
// one. Stop wakes the goroutine with a read deadline in the past, waits for it and clears
// that deadline, so that the connection's owner reads on as before.
//
// Where the socket cannot be reached (not a syscall.Conn, or not a Unix system), Start
// reports false and nothing is watched.
package hangup
