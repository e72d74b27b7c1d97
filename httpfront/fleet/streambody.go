package fleet

import (
	"bufio"
	"errors"
	"io"
	"net"
	"time"

	"github.com/valyala/fasthttp"
)

// Streamed answers. fasthttp's client reads a streamed response's body (Response.StreamBody)
// through its own body stream: each Read returns one chunk at most, its size parsed a byte at
// a time through the connection's bufio.Reader, which the stream pins (4 KB) until it is
// closed, and every Read takes a mutex. fasthttp offers no hook into that decoding: the
// body stream is installed by Response.ReadBody, its reader is unexported, and the reader's
// buffer cannot be taken back. The hook it does offer is the HostClient's Transport (a
// RoundTripper runs each exchange with the exported connection API: AcquireConn, the pooled
// reader and writer, ReleaseConn, CloseConn). streamTransport uses it for streamed answers
// only: it writes the request and reads the response headers as fasthttp's transport does,
// then installs streamBody, which decodes the body below fasthttp's client. Buffered answers
// keep fasthttp's transport.
//
// streamBody's reads go to the connection straight into the caller's buffer, and one read
// takes every chunk the connection has brought (chunkDecoder moves their data to the front
// of the same buffer, where the relay frames the events). The bytes fasthttp's reader read
// past the headers are handed out first; then the reader goes back to its pool: a held stream
// pins no buffer of the connection's. The end of the body (the last chunk and its trailers,
// the Content-Length, or the engine closing a body that has neither) leaves the connection
// reusable; anything else (a broken framing, a truncated body, bytes past the answer, a close
// before the end) closes it.

// streamTransport is the inference HostClient's Transport: streamed answers are read by
// streamBody, the others by fasthttp's own transport.
type streamTransport struct{}

var _ fasthttp.RoundTripper = streamTransport{}

// RoundTrip implements fasthttp.RoundTripper. For a streamed answer it does what fasthttp's
// transport does (the same deadlines, pooled writer and reader, retry verdicts) up to the
// response headers, then installs streamBody as the response's body stream.
func (streamTransport) RoundTrip(hc *fasthttp.HostClient, req *fasthttp.Request, resp *fasthttp.Response) (bool, error) {
	if !resp.StreamBody {
		return fasthttp.DefaultTransport.RoundTrip(hc, req, resp)
	}
	var deadline time.Time
	timeout := req.GetTimeOut()
	if timeout > 0 {
		deadline = time.Now().Add(timeout)
	}
	closeConn := req.ConnectionClose()
	cc, err := hc.AcquireConn(timeout, closeConn)
	if err != nil {
		return false, err
	}
	conn := cc.Conn()
	resp.ParseNetConn(conn)
	if err = conn.SetWriteDeadline(earliest(deadline, hc.WriteTimeout)); err != nil {
		hc.CloseConn(cc)
		return true, err
	}
	bw := hc.AcquireWriter(conn)
	err = req.Write(bw)
	if err == nil {
		err = bw.Flush()
	}
	hc.ReleaseWriter(bw)
	if err != nil {
		if IsTimeout(err) {
			err = fasthttp.ErrTimeout
		}
		hc.CloseConn(cc)
		return true, err
	}
	if err = conn.SetReadDeadline(earliest(deadline, hc.ReadTimeout)); err != nil {
		hc.CloseConn(cc)
		return true, err
	}
	br := hc.AcquireReader(conn)
	if err = readResponseHeader(resp, br); err != nil {
		hc.ReleaseReader(br)
		hc.CloseConn(cc)
		return true, err
	}
	closeConn = closeConn || resp.ConnectionClose()
	if resp.SkipBody || req.Header.IsHead() || noBody(resp.StatusCode()) {
		// No body (a 204, a 304, an answer to HEAD): the connection is done with.
		hc.ReleaseReader(br)
		if closeConn {
			hc.CloseConn(cc)
		} else {
			hc.ReleaseConn(cc)
		}
		return false, nil
	}
	b := &streamBody{c: conn, br: br, hc: hc, cc: cc, left: int64(resp.Header.ContentLength())}
	switch {
	case b.left == -1:
		b.mode = bodyChunked
	case b.left < 0:
		b.mode, closeConn = bodyToClose, true
	default:
		b.mode = bodyLength
		b.eof = b.left == 0
	}
	b.closeConn = closeConn
	resp.SetBodyStream(b, resp.Header.ContentLength())
	return false, nil
}

// earliest is the earlier of deadline and now + timeout (zero: none).
func earliest(deadline time.Time, timeout time.Duration) time.Time {
	if timeout <= 0 {
		return deadline
	}
	if t := time.Now().Add(timeout); deadline.IsZero() || t.Before(deadline) {
		return t
	}
	return deadline
}

// maxInterimAnswers bounds the 1xx answers read before the response's own headers.
const maxInterimAnswers = 16

var errInterimAnswers = errors.New("the engine sent too many 1xx answers")

// readResponseHeader reads the response's headers from br, past any 1xx answer (not a 101).
func readResponseHeader(resp *fasthttp.Response, br *bufio.Reader) error {
	for range maxInterimAnswers {
		if err := resp.Header.Read(br); err != nil {
			return err
		}
		if s := resp.StatusCode(); s < 100 || s > 199 || s == fasthttp.StatusSwitchingProtocols {
			return nil
		}
	}
	return errInterimAnswers
}

// noBody reports whether an answer with status s has no body whatever its headers say.
func noBody(s int) bool {
	return s >= 100 && s < 200 || s == fasthttp.StatusNoContent || s == fasthttp.StatusNotModified
}

// bodyMode is how a streamed body ends.
type bodyMode uint8

const (
	bodyChunked bodyMode = iota // at its last chunk
	bodyLength                  // after Content-Length bytes
	bodyToClose                 // when the engine closes the connection
)

// streamBody is a streamed answer's body (see streamTransport): each Read is one read of the
// connection into the caller's buffer, of which the data of every chunk it brought is
// returned, or the bytes fasthttp's reader holds past the headers. A read that brought only
// framing reads again. It is used by one goroutine at a time; Stream.Interrupt ends a read
// from elsewhere (it closes the socket), and CloseWithError, on the reading goroutine, gives
// the connection back.
type streamBody struct {
	c net.Conn
	// br is fasthttp's reader of the headers while it still holds bytes of the body; nil
	// once they were read (it went back to hc's pool).
	br *bufio.Reader
	hc *fasthttp.HostClient
	// cc is the connection hc.AcquireConn gave (fasthttp's unexported type, held as any: a
	// pointer, no allocation), given back to hc's pool or closed by release; closeConn: it
	// is closed whatever the body's end.
	cc        any
	closeConn bool
	mode      bodyMode
	dec       chunkDecoder
	// left is what is left of a Content-Length body.
	left int64
	// eof: the body ended where it should; err: the read failed (sticky); past: the engine
	// sent bytes past its answer; closed: CloseWithError ran.
	eof, past, closed bool
	err               error
}

var _ fasthttp.ReadCloserWithError = (*streamBody)(nil)

// maxFramingReads bounds the reads in a row that bring only framing (chunk sizes, CRLFs).
const maxFramingReads = 1 << 16

// Read reads the body's next data into p.
func (b *streamBody) Read(p []byte) (int, error) {
	if b.err != nil {
		return 0, b.err
	}
	if b.eof {
		return 0, io.EOF
	}
	if len(p) == 0 {
		return 0, nil
	}
	for range maxFramingReads {
		q := p
		if b.mode == bodyLength && int64(len(q)) > b.left {
			q = q[:b.left] // never past the answer
		}
		n, err := b.read(q)
		switch b.mode {
		case bodyChunked:
			m, used, derr := b.dec.decode(q[:n])
			switch {
			case derr != nil:
				b.err = derr
				return m, derr
			case b.dec.done():
				b.eof, b.past = true, used < n || b.br != nil && b.br.Buffered() > 0
				return m, io.EOF
			case err == io.EOF:
				err = io.ErrUnexpectedEOF // closed before the last chunk
			}
			if err != nil {
				b.err = err
				return m, err
			}
			if m > 0 {
				return m, nil
			}
		case bodyLength:
			b.left -= int64(n)
			switch {
			case b.left == 0:
				b.eof = true
				return n, io.EOF
			case err == io.EOF:
				err = io.ErrUnexpectedEOF
			}
			if err != nil {
				b.err = err
			}
			return n, err
		default:
			if err == io.EOF {
				b.eof = true
			} else if err != nil {
				b.err = err
			}
			return n, err
		}
	}
	b.err = errNoData
	return 0, b.err
}

// errNoData: the engine's reads kept bringing framing and no data.
var errNoData = errors.New("the engine's reads brought no data")

// read is one read of the body's bytes: those fasthttp's reader holds past the headers
// first (its buffer goes back to the pool once they are out), then the connection's.
func (b *streamBody) read(p []byte) (int, error) {
	if br := b.br; br != nil {
		if br.Buffered() > 0 {
			n, _ := br.Read(p) // buffered: a copy, no read of the connection
			if br.Buffered() == 0 {
				b.dropReader()
			}
			return n, nil
		}
		b.dropReader()
	}
	return b.c.Read(p)
}

// dropReader gives fasthttp's reader back to its pool.
func (b *streamBody) dropReader() {
	b.hc.ReleaseReader(b.br)
	b.br = nil
}

// CloseWithError implements fasthttp.ReadCloserWithError: the connection goes back to the
// pool when the body ended where it should, and is closed otherwise (err set, the body not
// read to its end, a failure, bytes past the answer). Later calls do nothing.
func (b *streamBody) CloseWithError(err error) error {
	if b.closed {
		return nil
	}
	b.closed = true
	if b.br != nil {
		b.past = b.past || b.eof && b.br.Buffered() > 0
		b.dropReader()
	}
	b.release(err == nil && b.eof && b.err == nil && !b.past && b.mode != bodyToClose)
	return nil
}

// release gives the connection back to hc's pool (reuse, unless it must close) or closes it.
func (b *streamBody) release(reuse bool) {
	if reuse && !b.closeConn {
		onConn(b.hc, b.cc, (*fasthttp.HostClient).ReleaseConn)
	} else {
		onConn(b.hc, b.cc, (*fasthttp.HostClient).CloseConn)
	}
}

// onConn runs f, a HostClient method that takes a connection of AcquireConn's, on cc. The
// connection's type is fasthttp's unexported one: f's signature names it, cc holds it.
func onConn[C any](hc *fasthttp.HostClient, cc any, f func(*fasthttp.HostClient, C)) {
	f(hc, cc.(C))
}
