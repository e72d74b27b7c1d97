package zmtp

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"time"
)

// Defaults of Limits and the handshake.
const (
	// DefaultMaxMessage bounds one data message, its frames together, in bytes (16 MiB).
	DefaultMaxMessage = 16 << 20
	// DefaultMaxFrames bounds the frames of one data message.
	DefaultMaxFrames = 64
	// DefaultHandshakeTimeout bounds the greeting and READY exchange.
	DefaultHandshakeTimeout = 5 * time.Second
	// maxCommand bounds one command frame (READY, SUBSCRIBE, PING...).
	maxCommand = 64 << 10
	// readChunk is the most a frame's buffer grows ahead of the bytes that arrived.
	readChunk = 64 << 10
	// keepBuffer is the largest buffer a Conn keeps between messages.
	keepBuffer = 1 << 20
)

// Frame flags.
const (
	flagMore    = 0x01
	flagLong    = 0x02
	flagCommand = 0x04
)

var (
	// ErrTooLarge is wrapped by the error for a peer that sent a frame, message or command
	// past the limits, or too many frames in one message.
	ErrTooLarge = errors.New("peer exceeded the ZMTP message limits")
	// ErrProtocol is wrapped by the error for a peer that does not speak ZMTP 3 as expected.
	ErrProtocol = errors.New("ZMTP protocol error")
)

// Limits bound what a peer may send. Zero fields take the defaults.
type Limits struct {
	// MaxMessage bounds one data message (its frames together) in bytes. Default
	// DefaultMaxMessage (16 MiB).
	MaxMessage int64
	// MaxFrames bounds the frames of one data message. Default DefaultMaxFrames (64).
	MaxFrames int
	// HandshakeTimeout bounds the handshake. Default DefaultHandshakeTimeout (5 s).
	HandshakeTimeout time.Duration
}

func (l Limits) withDefaults() Limits {
	if l.MaxMessage <= 0 {
		l.MaxMessage = DefaultMaxMessage
	}
	if l.MaxFrames <= 0 {
		l.MaxFrames = DefaultMaxFrames
	}
	if l.HandshakeTimeout <= 0 {
		l.HandshakeTimeout = DefaultHandshakeTimeout
	}
	return l
}

// peers lists the socket types each type talks to (ZMTP 3, RFC 23).
var peers = map[string][]string{
	"PUB":    {"SUB", "XSUB"},
	"XPUB":   {"SUB", "XSUB"},
	"SUB":    {"PUB", "XPUB"},
	"XSUB":   {"PUB", "XPUB"},
	"DEALER": {"ROUTER", "DEALER", "REP"},
	"ROUTER": {"DEALER", "REQ", "ROUTER"},
	"REQ":    {"ROUTER", "REP"},
}

// greeting is the 64-byte greeting: signature, version 3.0, NULL mechanism, as-server 0.
var greeting = func() (g [64]byte) {
	g[0], g[9], g[10], g[11] = 0xff, 0x7f, 3, 0
	copy(g[12:32], "NULL")
	return g
}()

// Message is one message read from a peer: a data message (Frames) or a command (Command
// and Data). Its slices alias the Conn's buffer until the next ReadMessage.
type Message struct {
	Frames  [][]byte
	Command string
	Data    []byte
}

// Conn is one ZMTP connection past its handshake.
type Conn struct {
	nc       net.Conn
	br       *bufio.Reader
	lim      Limits
	peerType string

	wmu sync.Mutex
	bw  *bufio.Writer

	hdr [9]byte // a frame header, under wmu

	// Owned by the reader.
	buf    []byte
	ends   []int
	frames [][]byte
	msg    Message
}

// Handshake runs the ZMTP handshake over nc as a socket of sockType and returns the
// connection. It closes nc when the handshake fails.
func Handshake(nc net.Conn, sockType string, lim Limits) (*Conn, error) {
	c, err := handshake(nc, sockType, lim)
	if err != nil {
		_ = nc.Close()
	}
	return c, err
}

// handshake is Handshake without closing nc on failure.
func handshake(nc net.Conn, sockType string, lim Limits) (*Conn, error) {
	lim = lim.withDefaults()
	c := &Conn{nc: nc, br: bufio.NewReaderSize(nc, 32<<10), bw: bufio.NewWriterSize(nc, 32<<10), lim: lim}
	if err := c.handshake(sockType); err != nil {
		return nil, err
	}
	return c, nil
}

func (c *Conn) handshake(sockType string) error {
	accept, ok := peers[sockType]
	if !ok {
		return fmt.Errorf("cannot handshake: unknown socket type %q", sockType)
	}
	if err := c.nc.SetDeadline(time.Now().Add(c.lim.HandshakeTimeout)); err != nil {
		return err
	}
	if _, err := c.bw.Write(greeting[:]); err != nil {
		return fmt.Errorf("cannot send greeting: %w", err)
	}
	if err := c.bw.Flush(); err != nil {
		return fmt.Errorf("cannot send greeting: %w", err)
	}
	var g [64]byte
	if _, err := io.ReadFull(c.br, g[:]); err != nil {
		return fmt.Errorf("cannot read greeting: %w", err)
	}
	if g[0] != 0xff || g[9]&1 != 1 || g[10] < 3 {
		return fmt.Errorf("cannot handshake: %w: peer does not speak ZMTP 3", ErrProtocol)
	}
	if mech := string(bytes.TrimRight(g[12:32], "\x00")); mech != "NULL" {
		return fmt.Errorf("cannot handshake: %w: unsupported security mechanism %q", ErrProtocol, mech)
	}
	if err := c.writeCommand("READY", appendProperty(nil, "Socket-Type", sockType)); err != nil {
		return fmt.Errorf("cannot send READY: %w", err)
	}
	if err := c.readMessage(); err != nil {
		return fmt.Errorf("cannot read READY: %w", err)
	}
	switch c.msg.Command {
	case "READY":
	case "ERROR":
		return fmt.Errorf("cannot handshake: peer error %q", c.msg.Data)
	default:
		return fmt.Errorf("cannot handshake: %w: expected READY, got %q", ErrProtocol, c.msg.Command)
	}
	peerType, err := socketType(c.msg.Data)
	if err != nil {
		return fmt.Errorf("cannot handshake: %w", err)
	}
	found := false
	for _, a := range accept {
		found = found || a == peerType
	}
	if !found {
		return fmt.Errorf("cannot handshake: %w: peer socket type %q does not talk to %s", ErrProtocol, peerType, sockType)
	}
	c.peerType = peerType
	return c.nc.SetDeadline(time.Time{})
}

// socketType reads the Socket-Type property of READY's metadata.
func socketType(b []byte) (string, error) {
	for len(b) > 0 {
		n := int(b[0])
		if len(b) < 1+n+4 {
			return "", fmt.Errorf("%w: truncated READY property", ErrProtocol)
		}
		name := b[1 : 1+n]
		vl := binary.BigEndian.Uint32(b[1+n:])
		b = b[1+n+4:]
		if uint64(vl) > uint64(len(b)) {
			return "", fmt.Errorf("%w: truncated READY property value", ErrProtocol)
		}
		if strings.EqualFold(string(name), "Socket-Type") {
			return string(b[:vl]), nil
		}
		b = b[vl:]
	}
	return "", fmt.Errorf("%w: READY without Socket-Type", ErrProtocol)
}

func appendProperty(dst []byte, name, value string) []byte {
	dst = append(dst, byte(len(name)))
	dst = append(dst, name...)
	dst = binary.BigEndian.AppendUint32(dst, uint32(len(value)))
	return append(dst, value...)
}

// PeerType is the peer's socket type from its READY command.
func (c *Conn) PeerType() string { return c.peerType }

// RemoteAddr is the peer's network address.
func (c *Conn) RemoteAddr() net.Addr { return c.nc.RemoteAddr() }

// Close closes the connection; a blocked ReadMessage returns an error.
func (c *Conn) Close() error { return c.nc.Close() }

// ReadMessage reads the next data message or command other than PING, which it answers with
// PONG. The result aliases the Conn's buffer until the next call. A peer past the limits
// gets an error wrapping ErrTooLarge, a malformed frame one wrapping ErrProtocol: close the
// connection after any error.
func (c *Conn) ReadMessage() (*Message, error) {
	for {
		if err := c.readMessage(); err != nil {
			return nil, err
		}
		if c.msg.Command != "PING" {
			return &c.msg, nil
		}
		// PING: 2-byte TTL, then a context of at most 16 bytes echoed in PONG.
		ctx := c.msg.Data[min(2, len(c.msg.Data)):]
		if err := c.writeCommand("PONG", ctx[:min(16, len(ctx))]); err != nil {
			return nil, err
		}
	}
}

// readMessage reads one command or whole data message into c.msg.
func (c *Conn) readMessage() error {
	if cap(c.buf) > keepBuffer {
		c.buf = nil // one large message does not pin its buffer
	}
	c.buf, c.ends = c.buf[:0], c.ends[:0]
	clear(c.frames)
	c.frames = c.frames[:0]
	c.msg = Message{}
	for {
		flags, err := c.br.ReadByte()
		if err != nil {
			return err
		}
		var size uint64
		if flags&flagLong != 0 {
			var b [8]byte
			if _, err := io.ReadFull(c.br, b[:]); err != nil {
				return err
			}
			size = binary.BigEndian.Uint64(b[:])
		} else {
			s, err := c.br.ReadByte()
			if err != nil {
				return err
			}
			size = uint64(s)
		}
		if flags&^(flagMore|flagLong|flagCommand) != 0 {
			return fmt.Errorf("%w: reserved frame flags %#x", ErrProtocol, flags)
		}
		if flags&flagCommand != 0 {
			if len(c.ends) > 0 || flags&flagMore != 0 {
				return fmt.Errorf("%w: command inside a multi-frame message", ErrProtocol)
			}
			if size > maxCommand {
				return fmt.Errorf("%w: command of %d bytes (limit %d)", ErrTooLarge, size, maxCommand)
			}
			if err := c.readBody(int(size)); err != nil {
				return err
			}
			return c.parseCommand()
		}
		if len(c.ends) >= c.lim.MaxFrames {
			return fmt.Errorf("%w: more than %d frames in one message", ErrTooLarge, c.lim.MaxFrames)
		}
		if size > uint64(c.lim.MaxMessage-int64(len(c.buf))) {
			return fmt.Errorf("%w: frame of %d bytes after %d in the message (limit %d)", ErrTooLarge, size, len(c.buf), c.lim.MaxMessage)
		}
		if err := c.readBody(int(size)); err != nil {
			return err
		}
		c.ends = append(c.ends, len(c.buf))
		if flags&flagMore == 0 {
			break
		}
	}
	start := 0
	for _, end := range c.ends {
		c.frames = append(c.frames, c.buf[start:end:end])
		start = end
	}
	c.msg.Frames = c.frames
	return nil
}

// readBody appends n bytes from the peer to c.buf, growing it with the bytes that arrive.
func (c *Conn) readBody(n int) error {
	for n > 0 {
		k := min(n, readChunk)
		if cap(c.buf)-len(c.buf) < k {
			c.buf = append(c.buf[:cap(c.buf)], make([]byte, k)...)[:len(c.buf)]
		}
		got, err := io.ReadFull(c.br, c.buf[len(c.buf):len(c.buf)+k])
		c.buf = c.buf[:len(c.buf)+got]
		if err != nil {
			if errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF
			}
			return err
		}
		n -= k
	}
	return nil
}

func (c *Conn) parseCommand() error {
	b := c.buf
	if len(b) < 1 || int(b[0]) > len(b)-1 {
		return fmt.Errorf("%w: malformed command frame", ErrProtocol)
	}
	n := int(b[0])
	c.msg.Command, c.msg.Data = string(b[1:1+n]), b[1+n:]
	return nil
}

// WriteMessage writes one data message of frames and flushes it.
func (c *Conn) WriteMessage(frames ...[]byte) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	for i, f := range frames {
		var flags byte
		if i < len(frames)-1 {
			flags = flagMore
		}
		c.writeFrame(flags, f)
	}
	return c.bw.Flush()
}

// Subscribe asks a PUB peer for the messages whose first frame starts with topic (ZMTP 3.0
// form: a message of 1 and the topic, which 3.1 peers accept too).
func (c *Conn) Subscribe(topic []byte) error {
	msg := make([]byte, 0, 1+len(topic))
	return c.WriteMessage(append(append(msg, 1), topic...))
}

// WriteCommand writes one command (ZMTP 3.1 SUBSCRIBE, CANCEL, PING...) and flushes it.
func (c *Conn) WriteCommand(name string, data []byte) error { return c.writeCommand(name, data) }

func (c *Conn) writeCommand(name string, data []byte) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	body := make([]byte, 0, 1+len(name)+len(data))
	body = append(append(append(body, byte(len(name))), name...), data...)
	c.writeFrame(flagCommand, body)
	return c.bw.Flush()
}

// writeFrame buffers one frame; the write error surfaces at Flush.
func (c *Conn) writeFrame(flags byte, body []byte) {
	h := c.hdr[:2]
	if len(body) > 255 {
		h = c.hdr[:9]
		h[0] = flags | flagLong
		binary.BigEndian.PutUint64(h[1:], uint64(len(body)))
	} else {
		h[0], h[1] = flags, byte(len(body))
	}
	_, _ = c.bw.Write(h)
	_, _ = c.bw.Write(body)
}

// SplitEndpoint turns "tcp://host:port" or "ipc://path" into a network and address.
func SplitEndpoint(endpoint string) (network, addr string, err error) {
	switch {
	case strings.HasPrefix(endpoint, "tcp://"):
		addr = strings.TrimPrefix(endpoint, "tcp://")
		if h, p, ok := strings.Cut(addr, ":"); ok && (h == "*" || h == "") && !strings.Contains(p, ":") {
			addr = ":" + p // "tcp://*:5557": every interface
		}
		return "tcp", addr, nil
	case strings.HasPrefix(endpoint, "ipc://"):
		return "unix", strings.TrimPrefix(endpoint, "ipc://"), nil
	}
	return "", "", fmt.Errorf("endpoint %q is not tcp:// or ipc://", endpoint)
}

// Dial connects to endpoint, runs the handshake as sockType within timeout (the handshake's
// own limit applies too) and returns the connection. Cancelling ctx closes it.
func Dial(ctx context.Context, endpoint, sockType string, timeout time.Duration, lim Limits) (*Conn, error) {
	network, addr, err := SplitEndpoint(endpoint)
	if err != nil {
		return nil, fmt.Errorf("cannot connect: %w", err)
	}
	d := net.Dialer{Timeout: timeout}
	nc, err := d.DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	stop := context.AfterFunc(ctx, func() { _ = nc.Close() })
	c, err := Handshake(nc, sockType, lim)
	if err != nil {
		stop()
		return nil, err
	}
	return c, nil
}
