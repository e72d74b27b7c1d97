package zmtp

import (
	"errors"

	"github.com/VictoriaMetrics/metrics"
)

// Metrics counts the peers a component disconnected for what they sent, in one family:
//
//	switchyard_zmq_peer_drops_total{component="...",reason="too_large"|"protocol"|"peers"}
//
// too_large: a frame, message or command past the limits; protocol: no ZMTP 3 handshake
// or a malformed frame; peers: a connection over a Listener's MaxPeers.
type Metrics struct {
	tooLarge, protocol, peers *metrics.Counter
}

// NewMetrics creates the counters of component on set; a nil set gets a private one.
func NewMetrics(set *metrics.Set, component string) *Metrics {
	if set == nil {
		set = metrics.NewSet()
	}
	name := func(reason string) string {
		return `switchyard_zmq_peer_drops_total{component="` + component + `",reason="` + reason + `"}`
	}
	return &Metrics{
		tooLarge: set.GetOrCreateCounter(name("too_large")),
		protocol: set.GetOrCreateCounter(name("protocol")),
		peers:    set.GetOrCreateCounter(name("peers")),
	}
}

// Drop counts a connection ended by err when err says the peer broke the limits or the
// protocol, and reports whether it did.
func (m *Metrics) Drop(err error) bool {
	switch {
	case err == nil:
		return false
	case errors.Is(err, ErrTooLarge):
		m.tooLarge.Inc()
	case errors.Is(err, ErrProtocol):
		m.protocol.Inc()
	default:
		return false
	}
	return true
}

// TooLarge, Protocol and Peers are the counts so far.
func (m *Metrics) TooLarge() uint64 { return m.tooLarge.Get() }
func (m *Metrics) Protocol() uint64 { return m.protocol.Get() }
func (m *Metrics) Peers() uint64    { return m.peers.Get() }
