package mockengine

import (
	"bufio"
	"log/slog"
	"net"
	"testing"
	"time"
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

// rawPeer speaks ZMTP with our own framing, to exercise the ZMTP 3.1 command forms.
type rawPeer struct {
	c  net.Conn
	br *bufio.Reader
	bw *bufio.Writer
}

func dialRaw(t *testing.T, port int, sockType string, accept ...string) *rawPeer {
	t.Helper()
	c, err := net.Dial("tcp", "127.0.0.1:"+itoa(port))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	p := &rawPeer{c: c, br: bufio.NewReader(c), bw: bufio.NewWriter(c)}
	if _, err := zmtpHandshake(c, p.br, p.bw, sockType, accept...); err != nil {
		t.Fatal(err)
	}
	_ = c.SetDeadline(time.Now().Add(testDeadline))
	return p
}

func (p *rawPeer) command(t *testing.T, name string, data []byte) {
	t.Helper()
	if err := writeZMTPFrame(p.bw, zmtpCommand, zmtpCommandBody(name, data)); err != nil {
		t.Fatal(err)
	}
	if err := p.bw.Flush(); err != nil {
		t.Fatal(err)
	}
}

func TestZMTPCommands(t *testing.T) {
	pub, err := listenPub("127.0.0.1:0", 100, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	p := dialRaw(t, pub.Port(), "SUB", "PUB")
	p.command(t, "PING", []byte{0, 10, 'c', 't', 'x'})
	flags, body, err := readZMTPFrame(p.br)
	if name, data, ok := parseZMTPCommand(flags, body); err != nil || !ok || name != "PONG" || string(data) != "ctx" {
		t.Fatalf("PING answered %q %q (%v)", name, data, err)
	}
	p.command(t, "SUBSCRIBE", []byte("t"))
	poll(t, "the subscription", func() bool { return pub.Subscribers() == 1 })
	pub.Send([]byte("topic"), []byte("body"))
	var frames []string
	for {
		flags, body, err := readZMTPFrame(p.br)
		if err != nil {
			t.Fatal(err)
		}
		frames = append(frames, string(body))
		if flags&zmtpMore == 0 {
			break
		}
	}
	if len(frames) != 2 || frames[0] != "topic" || frames[1] != "body" {
		t.Fatalf("frames %q", frames)
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
	br, bw := bufio.NewReader(c), bufio.NewWriter(c)
	// A PUB peer may not connect to a PUB socket: the engine closes the connection.
	_, _ = zmtpHandshake(c, br, bw, "PUB", "PUB", "SUB")
	_ = c.SetReadDeadline(time.Now().Add(testDeadline))
	if _, _, err := readZMTPFrame(br); err == nil {
		t.Fatal("connection stayed open for an incompatible peer")
	}
}

func TestZMTPCloseDisconnects(t *testing.T) {
	pub, err := listenPub("127.0.0.1:0", 1, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	p := dialRaw(t, pub.Port(), "SUB", "PUB")
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
	if _, _, err := readZMTPFrame(p.br); err == nil {
		t.Fatal("the subscriber's connection survived Close")
	}
}
