package mockengine

// A minimal ZMTP 3 server side: the PUB socket the engine publishes KV events and load
// gauges on, and the ROUTER socket that answers replay requests. Only what an engine needs
// is implemented: TCP, the NULL mechanism, subscriptions in both the ZMTP 3.0 (message) and
// 3.1 (command) forms, PING/PONG, and per-peer bounded send queues. Writing it here, rather
// than using a general ZMQ library, lets Close stop every goroutine and connection it
// started.

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"time"
)

// ZMTP frame flags.
const (
	zmtpMore    = 0x01
	zmtpLong    = 0x02
	zmtpCommand = 0x04
)

const (
	zmtpHandshakeTimeout = 5 * time.Second
	// zmtpMaxFrame bounds a frame read from a peer.
	zmtpMaxFrame = 1 << 20
)

var errZMTPClosed = errors.New("zmtp socket closed")

// zmtpGreeting is the 64-byte greeting: signature, version 3.0, NULL mechanism, as-server 0.
var zmtpGreeting = func() (g [64]byte) {
	g[0], g[9], g[10], g[11] = 0xff, 0x7f, 3, 0
	copy(g[12:32], "NULL")
	return g
}()

// zmtpHandshake exchanges greetings and READY commands over c. It returns the peer's
// metadata after checking that its socket type is one of accept.
func zmtpHandshake(c net.Conn, br *bufio.Reader, bw *bufio.Writer, sockType string, accept ...string) (map[string]string, error) {
	if err := c.SetDeadline(time.Now().Add(zmtpHandshakeTimeout)); err != nil {
		return nil, err
	}
	if _, err := bw.Write(zmtpGreeting[:]); err != nil {
		return nil, err
	}
	if err := bw.Flush(); err != nil {
		return nil, err
	}
	var g [64]byte
	if _, err := io.ReadFull(br, g[:]); err != nil {
		return nil, fmt.Errorf("cannot read greeting: %w", err)
	}
	if g[0] != 0xff || g[9]&1 != 1 || g[10] < 3 {
		return nil, errors.New("peer does not speak ZMTP 3")
	}
	if mech := string(bytes.TrimRight(g[12:32], "\x00")); mech != "NULL" {
		return nil, fmt.Errorf("unsupported security mechanism %q", mech)
	}
	ready := zmtpCommandBody("READY", zmtpProperty(nil, "Socket-Type", sockType))
	if err := writeZMTPFrame(bw, zmtpCommand, ready); err != nil {
		return nil, err
	}
	if err := bw.Flush(); err != nil {
		return nil, err
	}
	flags, body, err := readZMTPFrame(br)
	if err != nil {
		return nil, fmt.Errorf("cannot read READY: %w", err)
	}
	name, data, ok := parseZMTPCommand(flags, body)
	if !ok {
		return nil, errors.New("peer sent no command")
	}
	if name == "ERROR" {
		return nil, fmt.Errorf("peer error: %q", data)
	}
	if name != "READY" {
		return nil, fmt.Errorf("expected READY, got %q", name)
	}
	props, err := parseZMTPProperties(data)
	if err != nil {
		return nil, err
	}
	peerType := props["Socket-Type"]
	okType := false
	for _, a := range accept {
		okType = okType || peerType == a
	}
	if !okType {
		return nil, fmt.Errorf("incompatible peer socket type %q for %s", peerType, sockType)
	}
	return props, c.SetDeadline(time.Time{})
}

func zmtpCommandBody(name string, data []byte) []byte {
	b := make([]byte, 0, 1+len(name)+len(data))
	b = append(b, byte(len(name)))
	b = append(b, name...)
	return append(b, data...)
}

func zmtpProperty(dst []byte, name, value string) []byte {
	dst = append(dst, byte(len(name)))
	dst = append(dst, name...)
	dst = binary.BigEndian.AppendUint32(dst, uint32(len(value)))
	return append(dst, value...)
}

func parseZMTPCommand(flags byte, body []byte) (name string, data []byte, ok bool) {
	if flags&zmtpCommand == 0 || len(body) < 1 || int(body[0]) > len(body)-1 {
		return "", nil, false
	}
	n := int(body[0])
	return string(body[1 : 1+n]), body[1+n:], true
}

func parseZMTPProperties(b []byte) (map[string]string, error) {
	props := make(map[string]string, 2)
	for len(b) > 0 {
		n := int(b[0])
		if len(b) < 1+n+4 {
			return nil, errors.New("truncated READY property")
		}
		name := string(b[1 : 1+n])
		vl := binary.BigEndian.Uint32(b[1+n:])
		b = b[1+n+4:]
		if uint64(vl) > uint64(len(b)) {
			return nil, errors.New("truncated READY property value")
		}
		props[name] = string(b[:vl])
		b = b[vl:]
	}
	return props, nil
}

func readZMTPFrame(br *bufio.Reader) (byte, []byte, error) {
	flags, err := br.ReadByte()
	if err != nil {
		return 0, nil, err
	}
	var size uint64
	if flags&zmtpLong != 0 {
		var b [8]byte
		if _, err := io.ReadFull(br, b[:]); err != nil {
			return 0, nil, err
		}
		size = binary.BigEndian.Uint64(b[:])
	} else {
		s, err := br.ReadByte()
		if err != nil {
			return 0, nil, err
		}
		size = uint64(s)
	}
	if size > zmtpMaxFrame {
		return 0, nil, fmt.Errorf("frame of %d bytes exceeds %d", size, zmtpMaxFrame)
	}
	body := make([]byte, size)
	if _, err := io.ReadFull(br, body); err != nil {
		return 0, nil, err
	}
	return flags, body, nil
}

func writeZMTPFrame(bw *bufio.Writer, flags byte, body []byte) error {
	if len(body) > 255 {
		flags |= zmtpLong
		if err := bw.WriteByte(flags); err != nil {
			return err
		}
		var b [8]byte
		binary.BigEndian.PutUint64(b[:], uint64(len(body)))
		if _, err := bw.Write(b[:]); err != nil {
			return err
		}
	} else if _, err := bw.Write([]byte{flags, byte(len(body))}); err != nil {
		return err
	}
	_, err := bw.Write(body)
	return err
}

func writeZMTPMessage(bw *bufio.Writer, frames [][]byte) error {
	for i, f := range frames {
		var flags byte
		if i < len(frames)-1 {
			flags = zmtpMore
		}
		if err := writeZMTPFrame(bw, flags, f); err != nil {
			return err
		}
	}
	return nil
}

// answerPing replies to a PING command with PONG and its context.
func answerPing(bw *bufio.Writer, data []byte) error {
	ctx := []byte(nil)
	if len(data) >= 2 {
		ctx = data[2:]
	}
	if err := writeZMTPFrame(bw, zmtpCommand, zmtpCommandBody("PONG", ctx)); err != nil {
		return err
	}
	return bw.Flush()
}

// zmtpListener is the accept loop shared by both socket kinds.
type zmtpListener struct {
	ln    net.Listener
	log   *slog.Logger
	wg    sync.WaitGroup
	mu    sync.Mutex
	conns map[net.Conn]struct{}
	done  bool
}

func (l *zmtpListener) serve(handle func(net.Conn)) {
	l.conns = make(map[net.Conn]struct{})
	l.wg.Add(1)
	go func() {
		defer l.wg.Done()
		for {
			c, err := l.ln.Accept()
			if err != nil {
				l.mu.Lock()
				done := l.done
				l.mu.Unlock()
				if done || errors.Is(err, net.ErrClosed) {
					return
				}
				l.log.Warn("zmtp accept failed", slog.String("addr", l.ln.Addr().String()), slog.Any("err", err))
				continue
			}
			l.mu.Lock()
			if l.done {
				l.mu.Unlock()
				c.Close()
				return
			}
			l.conns[c] = struct{}{}
			l.wg.Add(1)
			l.mu.Unlock()
			go func() {
				defer l.wg.Done()
				defer func() {
					l.mu.Lock()
					delete(l.conns, c)
					l.mu.Unlock()
					c.Close()
				}()
				handle(c)
			}()
		}
	}()
}

// dropConns closes every peer connection and keeps listening, as a restarted process's
// sockets do: each peer sees its connection end and dials again. The peers' goroutines
// exit on their own (the listener's WaitGroup still tracks them).
func (l *zmtpListener) dropConns() {
	l.mu.Lock()
	defer l.mu.Unlock()
	for c := range l.conns {
		c.Close()
	}
}

func (l *zmtpListener) close() error {
	l.mu.Lock()
	l.done = true
	err := l.ln.Close()
	for c := range l.conns {
		c.Close()
	}
	l.mu.Unlock()
	l.wg.Wait()
	return err
}

// zmtpPub is a ZMTP 3 PUB socket: Send delivers a message to every subscriber whose
// subscription is a prefix of the first frame. Each subscriber has a queue of hwm messages;
// a message for a full queue is dropped, as a ZMQ PUB socket does at its high-water mark.
type zmtpPub struct {
	l     zmtpListener
	hwm   int
	mu    sync.Mutex
	peers map[*pubPeer]struct{}
}

type pubPeer struct {
	out  chan [][]byte
	done chan struct{}
	mu   sync.Mutex
	subs [][]byte
}

func listenPub(addr string, hwm int, log *slog.Logger) (*zmtpPub, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	p := &zmtpPub{l: zmtpListener{ln: ln, log: log}, hwm: max(hwm, 1), peers: make(map[*pubPeer]struct{})}
	p.l.serve(p.handle)
	return p, nil
}

// Port returns the bound TCP port.
func (p *zmtpPub) Port() int { return p.l.ln.Addr().(*net.TCPAddr).Port }

// Close stops accepting, disconnects every subscriber and waits for their goroutines.
func (p *zmtpPub) Close() error { return p.l.close() }

// DropPeers disconnects every subscriber and keeps listening: what is sent after it reaches
// only peers that connect again. The dropped peers leave the fan-out at once, so Send and
// Subscribers no longer see them while their goroutines wind down.
func (p *zmtpPub) DropPeers() {
	p.mu.Lock() // before l.mu: no handshake that ends after the drop registers meanwhile
	defer p.mu.Unlock()
	p.l.dropConns()
	clear(p.peers)
}

// Subscribers returns the number of connected peers that hold at least one subscription.
func (p *zmtpPub) Subscribers() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for peer := range p.peers {
		peer.mu.Lock()
		if len(peer.subs) > 0 {
			n++
		}
		peer.mu.Unlock()
	}
	return n
}

// Send queues frames to every matching subscriber. The frames must not be modified after.
func (p *zmtpPub) Send(frames ...[]byte) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for peer := range p.peers {
		if !peer.matches(frames[0]) {
			continue
		}
		select {
		case peer.out <- frames:
		default: // queue full: drop, as ZMQ does at the high-water mark
		}
	}
}

func (pp *pubPeer) matches(topic []byte) bool {
	pp.mu.Lock()
	defer pp.mu.Unlock()
	for _, s := range pp.subs {
		if bytes.HasPrefix(topic, s) {
			return true
		}
	}
	return false
}

func (pp *pubPeer) subscribe(topic []byte, on bool) {
	pp.mu.Lock()
	defer pp.mu.Unlock()
	if on {
		pp.subs = append(pp.subs, topic)
		return
	}
	for i, s := range pp.subs {
		if bytes.Equal(s, topic) {
			pp.subs = append(pp.subs[:i], pp.subs[i+1:]...)
			return
		}
	}
}

func (p *zmtpPub) handle(c net.Conn) {
	br, bw := bufio.NewReader(c), bufio.NewWriter(c)
	if _, err := zmtpHandshake(c, br, bw, "PUB", "SUB", "XSUB"); err != nil {
		p.l.log.Debug("zmtp handshake failed", slog.Any("err", err))
		return
	}
	peer := &pubPeer{out: make(chan [][]byte, p.hwm), done: make(chan struct{})}
	p.mu.Lock()
	p.peers[peer] = struct{}{}
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		delete(p.peers, peer)
		p.mu.Unlock()
	}()
	var wmu sync.Mutex // the writer and PONG replies share bw
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-peer.done:
				return
			case msg := <-peer.out:
				wmu.Lock()
				err := writeZMTPMessage(bw, msg)
				for err == nil && len(peer.out) > 0 {
					err = writeZMTPMessage(bw, <-peer.out)
				}
				if err == nil {
					err = bw.Flush()
				}
				wmu.Unlock()
				if err != nil {
					c.Close()
					return
				}
			}
		}
	}()
	defer wg.Wait()
	defer close(peer.done)
	for {
		flags, body, err := readZMTPFrame(br)
		if err != nil {
			return
		}
		if name, data, ok := parseZMTPCommand(flags, body); ok {
			switch name {
			case "SUBSCRIBE":
				peer.subscribe(data, true)
			case "CANCEL":
				peer.subscribe(data, false)
			case "PING":
				wmu.Lock()
				err := answerPing(bw, data)
				wmu.Unlock()
				if err != nil {
					return
				}
			}
			continue
		}
		// ZMTP 3.0 subscription message: 1 or 0, then the topic.
		if flags&zmtpMore == 0 && len(body) > 0 && body[0] <= 1 {
			peer.subscribe(body[1:], body[0] == 1)
		}
	}
}

// zmtpRouter is a ZMTP 3 ROUTER socket that hands each received message to handler on the
// peer's goroutine; the handler answers through routerPeer.Send.
type zmtpRouter struct {
	l       zmtpListener
	handler func(*routerPeer, [][]byte)
}

type routerPeer struct {
	mu sync.Mutex
	bw *bufio.Writer
}

// Send writes one multipart message to the peer.
func (rp *routerPeer) Send(frames ...[]byte) error {
	rp.mu.Lock()
	defer rp.mu.Unlock()
	if err := writeZMTPMessage(rp.bw, frames); err != nil {
		return err
	}
	return rp.bw.Flush()
}

func listenRouter(addr string, log *slog.Logger, handler func(*routerPeer, [][]byte)) (*zmtpRouter, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	r := &zmtpRouter{l: zmtpListener{ln: ln, log: log}, handler: handler}
	r.l.serve(r.handle)
	return r, nil
}

// Port returns the bound TCP port.
func (r *zmtpRouter) Port() int { return r.l.ln.Addr().(*net.TCPAddr).Port }

// Close stops accepting, disconnects every peer and waits for their goroutines.
func (r *zmtpRouter) Close() error { return r.l.close() }

// DropPeers disconnects every peer and keeps listening.
func (r *zmtpRouter) DropPeers() { r.l.dropConns() }

func (r *zmtpRouter) handle(c net.Conn) {
	br, bw := bufio.NewReader(c), bufio.NewWriter(c)
	if _, err := zmtpHandshake(c, br, bw, "ROUTER", "DEALER", "REQ", "ROUTER"); err != nil {
		r.l.log.Debug("zmtp handshake failed", slog.Any("err", err))
		return
	}
	peer := &routerPeer{bw: bw}
	var msg [][]byte
	for {
		flags, body, err := readZMTPFrame(br)
		if err != nil {
			return
		}
		if name, data, ok := parseZMTPCommand(flags, body); ok {
			if name == "PING" {
				peer.mu.Lock()
				err := answerPing(bw, data)
				peer.mu.Unlock()
				if err != nil {
					return
				}
			}
			continue
		}
		msg = append(msg, body)
		if flags&zmtpMore == 0 {
			r.handler(peer, msg)
			msg = nil
		}
	}
}
