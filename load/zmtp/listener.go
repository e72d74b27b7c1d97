package zmtp

import (
	"errors"
	"log/slog"
	"net"
	"sync"
	"time"
)

// DefaultMaxPeers bounds the connections a Listener holds at once.
const DefaultMaxPeers = 1024

// ListenerConfig configures a Listener.
type ListenerConfig struct {
	// SocketType is the type the Listener's connections speak ("PUB", "SUB", "ROUTER").
	// Required.
	SocketType string
	// Limits bound what each peer may send.
	Limits Limits
	// MaxPeers bounds the connections held at once; one more is closed at once and counted
	// (reason "peers"). Default DefaultMaxPeers (1024).
	MaxPeers int
	// Metrics counts refused and dropped peers. Default: private counters.
	Metrics *Metrics
	// Logger receives accept failures. Default: discard.
	Logger *slog.Logger
}

// Listener accepts ZMTP peers and runs a handler per peer, each on its own goroutine after
// a successful handshake. It is safe for concurrent use.
type Listener struct {
	cfg ListenerConfig
	ln  net.Listener
	wg  sync.WaitGroup

	mu    sync.Mutex
	conns map[net.Conn]struct{}
	done  bool
}

// Listen binds endpoint ("tcp://host:port", port 0 for any; "ipc://path") and starts
// accepting peers, handing each to handle after its handshake. The connection is closed
// when handle returns; an error handle returns is counted by its kind (Metrics.Drop).
func Listen(endpoint string, cfg ListenerConfig, handle func(*Conn) error) (*Listener, error) {
	network, addr, err := SplitEndpoint(endpoint)
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen(network, addr)
	if err != nil {
		return nil, err
	}
	if cfg.MaxPeers <= 0 {
		cfg.MaxPeers = DefaultMaxPeers
	}
	if cfg.Metrics == nil {
		cfg.Metrics = NewMetrics(nil, "")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	cfg.Limits = cfg.Limits.withDefaults()
	l := &Listener{cfg: cfg, ln: ln, conns: make(map[net.Conn]struct{})}
	l.wg.Add(1)
	go l.accept(handle)
	return l, nil
}

// Addr is the bound address.
func (l *Listener) Addr() net.Addr { return l.ln.Addr() }

// Endpoint is the bound endpoint, "tcp://host:port" with the port the system chose.
func (l *Listener) Endpoint() string {
	if a, ok := l.ln.Addr().(*net.TCPAddr); ok {
		return "tcp://" + a.String()
	}
	return "ipc://" + l.ln.Addr().String()
}

// Port is the bound TCP port (0 for ipc).
func (l *Listener) Port() int {
	if a, ok := l.ln.Addr().(*net.TCPAddr); ok {
		return a.Port
	}
	return 0
}

// Peers is the number of connections held.
func (l *Listener) Peers() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.conns)
}

func (l *Listener) accept(handle func(*Conn) error) {
	defer l.wg.Done()
	var delay time.Duration
	for {
		nc, err := l.ln.Accept()
		if err != nil {
			l.mu.Lock()
			done := l.done
			l.mu.Unlock()
			if done || errors.Is(err, net.ErrClosed) {
				return
			}
			// Out of descriptors and the like: back off as net/http does, up to 1 s.
			delay = min(max(2*delay, 5*time.Millisecond), time.Second)
			l.cfg.Logger.Warn("zmtp accept failed", slog.String("addr", l.ln.Addr().String()), slog.Any("error", err))
			time.Sleep(delay)
			continue
		}
		delay = 0
		l.mu.Lock()
		if l.done {
			l.mu.Unlock()
			_ = nc.Close()
			return
		}
		if len(l.conns) >= l.cfg.MaxPeers {
			l.mu.Unlock()
			l.cfg.Metrics.peers.Inc() // counted before the peer sees the connection end
			_ = nc.Close()
			continue
		}
		l.conns[nc] = struct{}{}
		l.wg.Add(1)
		l.mu.Unlock()
		go l.serve(nc, handle)
	}
}

func (l *Listener) serve(nc net.Conn, handle func(*Conn) error) {
	defer l.wg.Done()
	defer func() {
		l.mu.Lock()
		delete(l.conns, nc)
		l.mu.Unlock()
		_ = nc.Close()
	}()
	c, err := handshake(nc, l.cfg.SocketType, l.cfg.Limits)
	if err != nil {
		l.cfg.Metrics.Drop(err) // counted before the peer sees the connection end
		return
	}
	l.cfg.Metrics.Drop(handle(c))
}

// DropPeers closes every peer connection and keeps listening, as a restarted process's
// sockets do: each peer sees its connection end (and dials again).
func (l *Listener) DropPeers() {
	l.mu.Lock()
	defer l.mu.Unlock()
	for nc := range l.conns {
		_ = nc.Close()
	}
}

// Close stops accepting, closes every peer connection and waits for the handlers.
func (l *Listener) Close() error {
	l.mu.Lock()
	l.done = true
	err := l.ln.Close()
	for nc := range l.conns {
		_ = nc.Close()
	}
	l.mu.Unlock()
	l.wg.Wait()
	return err
}
