// Package zmtptest provides hostile ZMTP peers for tests: the raw bytes of a handshake and of
// frames that claim more than any limit, a server that sends them to whoever connects and a
// client that sends them to a listening socket; and LogCounter, which counts the
// rate-limited warnings a subscriber logs about such peers. Everything runs on 127.0.0.1 and
// stops when the test ends.
package zmtptest

import (
	"bytes"
	"encoding/binary"
	"io"
	"net"
	"testing"
	"time"

	"switchyard/internal/rawtest"
)

// Wait bounds every wait of these helpers.
const Wait = 10 * time.Second

// Hello is a peer's side of a ZMTP 3.0 handshake as sockType (NULL mechanism): the greeting
// and the READY command.
func Hello(sockType string) []byte {
	g := make([]byte, 64)
	g[0], g[9], g[10] = 0xff, 0x7f, 3
	copy(g[12:], "NULL")
	ready := append([]byte{5}, "READY"...)
	ready = append(ready, 11)
	ready = append(ready, "Socket-Type"...)
	ready = binary.BigEndian.AppendUint32(ready, uint32(len(sockType)))
	ready = append(ready, sockType...)
	return append(append(g, 0x04, byte(len(ready))), ready...)
}

// Claim is a data frame header announcing size bytes, followed by a few of them.
func Claim(size uint64) []byte {
	return append(binary.BigEndian.AppendUint64([]byte{0x02}, size), make([]byte, 64)...)
}

// Frames is a message of n empty frames.
func Frames(n int) []byte {
	return append(bytes.Repeat([]byte{0x01, 0}, n-1), 0, 0)
}

// Server listens on 127.0.0.1 and, to every peer that connects, sends Hello(sockType) and
// attack, then waits for the peer to hang up. Each connection's end is reported on ends:
// nil when the peer closed it.
func Server(t testing.TB, sockType string, attack []byte) (endpoint string, ends <-chan error) {
	t.Helper()
	out := make(chan error, 64)
	addr := rawtest.Serve(t, func(c net.Conn) {
		_ = c.SetDeadline(time.Now().Add(Wait))
		if _, err := c.Write(append(Hello(sockType), attack...)); err != nil {
			out <- err
			return
		}
		_, err := io.Copy(io.Discard, c)
		select {
		case out <- err:
		default:
		}
	})
	return "tcp://" + addr, out
}

// HungUp waits for n connection ends of a Server that the peer caused.
func HungUp(t testing.TB, ends <-chan error, n int) {
	t.Helper()
	for i := range n {
		select {
		case err := <-ends:
			if err != nil {
				t.Fatalf("connection %d: %v, want closed by the peer", i, err)
			}
		case <-time.After(Wait):
			t.Fatalf("connection %d not closed by the peer", i)
		}
	}
}

// Attack dials addr ("host:port"), sends Hello(sockType) and attack, and fails the test
// unless the listener hangs up.
func Attack(t testing.TB, addr, sockType string, attack []byte) {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, Wait)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(Wait))
	if _, err := c.Write(append(Hello(sockType), attack...)); err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(io.Discard, c); err != nil {
		t.Fatalf("%s did not hang up: %v", addr, err)
	}
}
