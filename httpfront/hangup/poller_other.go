//go:build !linux

package hangup

import (
	"errors"
	"net"
)

// Poller needs epoll; elsewhere NewPoller fails and connections are watched one goroutine
// each (Start).
type Poller struct{}

// Conn is one connection's watch state (unused here).
type Conn struct{}

// Target is told that a watched connection's peer has hung up.
type Target interface{ Gone() }

// NewPoller reports that this platform has no Poller.
func NewPoller() (*Poller, error) { return nil, errors.ErrUnsupported }

// Close does nothing.
func (p *Poller) Close() error { return nil }

// Watch watches nothing.
func (p *Poller) Watch(*Conn, net.Conn, Target) bool { return false }

// Stop reports no hang-up.
func (p *Poller) Stop(*Conn) bool { return false }

// Forget does nothing.
func (p *Poller) Forget(*Conn) {}
