// Package hangup tells when the peer of a connection hangs up while nothing is being read
// from it: a server waiting on an engine for a request whose client has gone, an engine
// whose caller has gone.
//
// A Poller (Linux) watches any number of connections with one goroutine and one epoll
// instance: a connection is added once, edge-triggered on hang-up events only (bytes
// arriving wake nothing), and each watch is armed and disarmed with atomics: no goroutine,
// channel, system call or allocation per watch. On an edge the socket is peeked at without
// consuming anything: an orderly close or a reset is a hang-up (the target's Gone runs); bytes
// (a pipelined request) end the watch without one. An edge that comes while no watch is
// armed is remembered and checked by the next watch.
//
// Start is the portable watch: one goroutine parked in the runtime's poller on the socket,
// peeking the same way. Stop wakes the goroutine with a read deadline in the past, waits for
// it and clears that deadline, so that the connection's owner reads on as before.
//
// Where the socket cannot be reached (not a syscall.Conn, or not a Unix system), Start and
// Watch report false and nothing is watched.
package hangup
