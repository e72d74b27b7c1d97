package mockengine

// The engine side of ZeroMQ on the project's one ZMTP implementation (load/zmtp): the PUB
// socket the engine publishes KV events and load gauges on (bound, or dialing a router's
// bound SUB as vLLM's publisher does), and the ROUTER socket that answers replay requests.
// Subscriptions come in both the ZMTP 3.0 (message) and 3.1 (command) forms; each peer has
// a bounded send queue. Close stops every goroutine and connection it started.

import (
	"bytes"
	"context"
	"log/slog"
	"sync"
	"time"

	"switchyard/load/zmtp"
)

// zmtpPub is a ZMTP 3 PUB socket: Send delivers a message to every subscriber whose
// subscription is a prefix of the first frame. Each subscriber has a queue of hwm messages;
// a message for a full queue is dropped, as a ZMQ PUB socket does at its high-water mark.
type zmtpPub struct {
	l     *zmtp.Listener // nil for a dialing PUB
	hwm   int
	mu    sync.Mutex
	peers map[*pubPeer]struct{}

	// A dialing PUB: its redial loop and the connection it holds.
	cancel context.CancelFunc
	wg     sync.WaitGroup
	conn   *zmtp.Conn
}

type pubPeer struct {
	out  chan [][]byte
	mu   sync.Mutex
	subs [][]byte
}

func listenPub(addr string, hwm int, log *slog.Logger) (*zmtpPub, error) {
	p := &zmtpPub{hwm: max(hwm, 1), peers: make(map[*pubPeer]struct{})}
	l, err := zmtp.Listen("tcp://"+addr, zmtp.ListenerConfig{SocketType: "PUB", Logger: log}, p.serve)
	if err != nil {
		return nil, err
	}
	p.l = l
	return p, nil
}

// dialPub is a PUB that dials endpoint (a router's bound SUB) and redials when the
// connection ends, as a vLLM publisher with a non-wildcard endpoint does.
func dialPub(endpoint string, hwm int) *zmtpPub {
	ctx, cancel := context.WithCancel(context.Background())
	p := &zmtpPub{hwm: max(hwm, 1), peers: make(map[*pubPeer]struct{}), cancel: cancel}
	p.wg.Go(func() {
		zmtp.Retry(ctx, zmtp.Backoff{Min: 10 * time.Millisecond, Max: time.Second}, func(ctx context.Context, _ int) (bool, error) {
			c, err := zmtp.Dial(ctx, endpoint, "PUB", 2*time.Second, zmtp.Limits{})
			if err != nil {
				return false, err
			}
			p.mu.Lock()
			p.conn = c
			p.mu.Unlock()
			err = p.serve(c)
			_ = c.Close()
			return true, err
		}, nil)
	})
	return p
}

// Port returns the bound TCP port (0 for a dialing PUB).
func (p *zmtpPub) Port() int {
	if p.l == nil {
		return 0
	}
	return p.l.Port()
}

// Close stops accepting (or dialing), disconnects every subscriber and waits for their
// goroutines.
func (p *zmtpPub) Close() error {
	if p.l != nil {
		return p.l.Close()
	}
	p.cancel()
	p.mu.Lock()
	if p.conn != nil {
		_ = p.conn.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
	return nil
}

// DropPeers disconnects every subscriber and keeps listening (or redials): what is sent
// after it reaches only peers that connect again. The dropped peers leave the fan-out at
// once, so Send and Subscribers no longer see them while their goroutines wind down.
func (p *zmtpPub) DropPeers() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.l != nil {
		p.l.DropPeers()
	} else if p.conn != nil {
		_ = p.conn.Close()
	}
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
		pp.subs = append(pp.subs, bytes.Clone(topic))
		return
	}
	for i, s := range pp.subs {
		if bytes.Equal(s, topic) {
			pp.subs = append(pp.subs[:i], pp.subs[i+1:]...)
			return
		}
	}
}

// serve runs one subscriber: its writer on a goroutine, its subscriptions read here.
func (p *zmtpPub) serve(c *zmtp.Conn) error {
	peer := &pubPeer{out: make(chan [][]byte, p.hwm)}
	p.mu.Lock()
	p.peers[peer] = struct{}{}
	p.mu.Unlock()
	done := make(chan struct{})
	var wg sync.WaitGroup
	defer wg.Wait()
	defer close(done)
	defer func() {
		p.mu.Lock()
		delete(p.peers, peer)
		p.mu.Unlock()
	}()
	wg.Go(func() {
		for {
			select {
			case <-done:
				return
			case msg := <-peer.out:
				if err := c.WriteMessage(msg...); err != nil {
					_ = c.Close()
					return
				}
			}
		}
	})
	for {
		msg, err := c.ReadMessage()
		if err != nil {
			return err
		}
		switch {
		case msg.Command == "SUBSCRIBE":
			peer.subscribe(msg.Data, true)
		case msg.Command == "CANCEL":
			peer.subscribe(msg.Data, false)
		case msg.Command == "" && len(msg.Frames) == 1 && len(msg.Frames[0]) > 0 && msg.Frames[0][0] <= 1:
			// ZMTP 3.0 subscription message: 1 or 0, then the topic.
			peer.subscribe(msg.Frames[0][1:], msg.Frames[0][0] == 1)
		}
	}
}

// zmtpRouter is a ZMTP 3 ROUTER socket that hands each received message to handler on the
// peer's goroutine; the handler answers through routerPeer.Send.
type zmtpRouter struct {
	l       *zmtp.Listener
	handler func(*routerPeer, [][]byte)
}

type routerPeer struct{ c *zmtp.Conn }

// Send writes one multipart message to the peer.
func (rp *routerPeer) Send(frames ...[]byte) error { return rp.c.WriteMessage(frames...) }

func listenRouter(addr string, log *slog.Logger, handler func(*routerPeer, [][]byte)) (*zmtpRouter, error) {
	r := &zmtpRouter{handler: handler}
	l, err := zmtp.Listen("tcp://"+addr, zmtp.ListenerConfig{SocketType: "ROUTER", Logger: log}, r.serve)
	if err != nil {
		return nil, err
	}
	r.l = l
	return r, nil
}

// Port returns the bound TCP port.
func (r *zmtpRouter) Port() int { return r.l.Port() }

// Close stops accepting, disconnects every peer and waits for their goroutines.
func (r *zmtpRouter) Close() error { return r.l.Close() }

// DropPeers disconnects every peer and keeps listening.
func (r *zmtpRouter) DropPeers() { r.l.DropPeers() }

func (r *zmtpRouter) serve(c *zmtp.Conn) error {
	peer := &routerPeer{c: c}
	for {
		msg, err := c.ReadMessage()
		if err != nil {
			return err
		}
		if msg.Command != "" {
			continue
		}
		frames := make([][]byte, len(msg.Frames))
		for i, f := range msg.Frames {
			frames[i] = bytes.Clone(f)
		}
		r.handler(peer, frames)
	}
}
