package mockengine

import (
	"context"
	"log/slog"
	"net"
	"testing"
	"time"

	"switchyard/load/zmtp"
)

func TestZMTPPubTopics(t *testing.T) {
	pub, err := listenPub("127.0.0.1:0", 100, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	ep := "tcp://127.0.0.1:" + itoa(pub.Port())
	a, b := dialSub(t, ep, "kv"), dialSub(t, ep, "load")
	poll(t, "two subscribers", func() bool { return pub.Subscribers() == 2 })
	pub.Send([]byte("kv@1"), []byte("x"))
	pub.Send([]byte("load"), []byte("y"))
	pub.Send([]byte("other"), []byte("z"))
	pub.Send([]byte("kv"), []byte("w"), make([]byte, 70000)) // a long frame
	if m := a.next(t); string(m.Frames[0]) != "kv@1" || string(m.Frames[1]) != "x" {
		t.Fatalf("a got %q", m.Frames)
	}
	if m := a.next(t); string(m.Frames[0]) != "kv" || len(m.Frames[2]) != 70000 {
		t.Fatalf("a got %d frames", len(m.Frames))
	}
	if m := b.next(t); string(m.Frames[0]) != "load" || string(m.Frames[1]) != "y" {
		t.Fatalf("b got %q", m.Frames)
	}
	select {
	case m := <-b.msgs:
		t.Fatalf("b got a message it did not subscribe to: %q", m.Frames)
	default:
	}
}

// rawPeer is one ZMTP connection driven by hand, to exercise the ZMTP 3.1 command forms.
type rawPeer struct {
	c *zmtp.Conn
}

func dialRaw(t *testing.T, port int, sockType string) *rawPeer {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	c, err := zmtp.Dial(ctx, "tcp://127.0.0.1:"+itoa(port), sockType, testDeadline, zmtp.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return &rawPeer{c: c}
}

func (p *rawPeer) command(t *testing.T, name string, data []byte) {
	t.Helper()
	if err := p.c.WriteCommand(name, data); err != nil {
		t.Fatal(err)
	}
}

// read reads the next message, failing the test after testDeadline.
func (p *rawPeer) read(t *testing.T) (*zmtp.Message, error) {
	t.Helper()
	type res struct {
		m   *zmtp.Message
		err error
	}
	ch := make(chan res, 1)
	go func() {
		m, err := p.c.ReadMessage()
		ch <- res{m, err}
	}()
	select {
	case r := <-ch:
		return r.m, r.err
	case <-time.After(testDeadline):
		_ = p.c.Close()
		r := <-ch
		t.Fatalf("nothing read within %v", testDeadline)
		return r.m, r.err
	}
}

func TestZMTPCommands(t *testing.T) {
	pub, err := listenPub("127.0.0.1:0", 100, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	p := dialRaw(t, pub.Port(), "SUB")
	p.command(t, "PING", []byte{0, 10, 'c', 't', 'x'})
	if m, err := p.read(t); err != nil || m.Command != "PONG" || string(m.Data) != "ctx" {
		t.Fatalf("PING answered %+v (%v)", m, err)
	}
	p.command(t, "SUBSCRIBE", []byte("t"))
	poll(t, "the subscription", func() bool { return pub.Subscribers() == 1 })
	pub.Send([]byte("topic"), []byte("body"))
	m, err := p.read(t)
	if err != nil || len(m.Frames) != 2 || string(m.Frames[0]) != "topic" || string(m.Frames[1]) != "body" {
		t.Fatalf("got %+v (%v)", m, err)
	}
	p.command(t, "CANCEL", []byte("t"))
	poll(t, "the cancellation", func() bool { return pub.Subscribers() == 0 })
}

func TestZMTPRejectsIncompatiblePeers(t *testing.T) {
	pub, err := listenPub("127.0.0.1:0", 1, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	c, err := net.Dial("tcp", "127.0.0.1:"+itoa(pub.Port()))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// A PUB peer may not connect to a PUB socket: the engine closes the connection.
	_ = c.SetDeadline(time.Now().Add(testDeadline))
	if _, err := zmtp.Handshake(c, "PUB", zmtp.Limits{HandshakeTimeout: testDeadline}); err == nil {
		t.Fatal("a PUB completed a handshake with a PUB")
	}
	if _, err := c.Read(make([]byte, 1)); err == nil {
		t.Fatal("connection stayed open for an incompatible peer")
	}
}

func TestZMTPCloseDisconnects(t *testing.T) {
	pub, err := listenPub("127.0.0.1:0", 1, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	p := dialRaw(t, pub.Port(), "SUB")
	p.command(t, "SUBSCRIBE", nil)
	poll(t, "the subscription", func() bool { return pub.Subscribers() == 1 })
	done := make(chan error, 1)
	go func() { done <- pub.Close() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(testDeadline):
		t.Fatal("Close did not return")
	}
	if _, err := p.read(t); err == nil {
		t.Fatal("the subscriber's connection survived Close")
	}
}
