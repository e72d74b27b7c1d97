// Package zmtp is the project's one ZeroMQ transport: ZMTP 3 over TCP (and ipc) with the
// NULL security mechanism, as the engines' KV-event publishers, load gauges and replay
// sockets speak it (INTEROP.md). The router's subscriptions (packages load and kv) and the
// mock engine's publishers (bench/mockengine) both use it.
//
// # What it owns
//
//   - The handshake (Handshake, Dial): the 64-byte greeting (version 3.0, NULL), the READY
//     command with the socket type, and the check that the peer's type fits ours (SUB with
//     PUB or XPUB, DEALER with ROUTER, ...). A handshake has a deadline.
//   - Framing (Conn): ReadMessage returns one whole data message, answering PING itself and
//     handing other commands (SUBSCRIBE, CANCEL) to the caller; WriteMessage writes one.
//   - Limits: every length a peer sends is checked before anything is allocated for it. A
//     data message may hold at most Limits.MaxFrames frames and Limits.MaxMessage bytes
//     (frames together), a command at most 64 KiB. The buffer of a frame grows with the
//     bytes that actually arrive, so a peer that claims 2^40 bytes and sends ten costs ten.
//     A peer past a limit gets ErrTooLarge: the caller closes the connection and counts it
//     (Metrics).
//   - Listener: an accept loop with a bound on peers, a handshake per peer on its own
//     goroutine, and DropPeers/Close that end every connection.
//
// Sockets with fan-out or queues (a PUB with subscriptions, a bound SUB that merges its
// peers) are built by their users on Conn and Listener: the mock engine's PUB and ROUTER,
// kv's bound SUB.
//
// # Concurrency model
//
// A Conn has one reader at a time (ReadMessage) and any number of writers (WriteMessage is
// serialized, and ReadMessage's PONG takes the same lock). The frames ReadMessage returns
// alias the Conn's buffer and are valid until its next ReadMessage. A Listener is safe for
// concurrent use; it runs each handler on a goroutine of its own.
//
// # What a caller must release
//
// Close every Conn (or cancel the context given to Dial, which closes it) and Close every
// Listener (it waits for its handlers).
package zmtp
