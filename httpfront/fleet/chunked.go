package fleet

import (
	"bytes"
	"errors"
	"fmt"
)

// ErrBadChunk is the read error of a streamed answer whose chunked framing is broken: a chunk
// size that is not hex or too long, a missing CRLF, a size line or trailer section past its
// bound. The connection is not reused.
var ErrBadChunk = errors.New("the engine's chunked answer is malformed")

// The framing errors, made once: a hostile engine costs no allocation per failure.
var (
	errChunkSizeDigit = fmt.Errorf("%w: its chunk size is not a hex number", ErrBadChunk)
	errChunkSizeLong  = fmt.Errorf("%w: its chunk size has more than %d hex digits", ErrBadChunk, maxChunkSizeDigits)
	errChunkSizeChar  = fmt.Errorf("%w: an unexpected character follows its chunk size", ErrBadChunk)
	errChunkLineLF    = fmt.Errorf("%w: a bare LF in its chunk size line or trailers", ErrBadChunk)
	errChunkLineLong  = fmt.Errorf("%w: its chunk size line is longer than %d bytes", ErrBadChunk, maxChunkLine)
	errChunkCRLF      = fmt.Errorf("%w: a chunk's data is not followed by CRLF", ErrBadChunk)
	errChunkLineCRLF  = fmt.Errorf("%w: a line of its framing does not end with CRLF", ErrBadChunk)
	errTrailerLong    = fmt.Errorf("%w: its trailers are longer than %d bytes", ErrBadChunk, maxTrailerBytes)
)

const (
	// maxChunkSizeDigits bounds a chunk size (15 hex digits: under 2^60 bytes), so that it
	// never overflows.
	maxChunkSizeDigits = 15
	// maxChunkLine bounds a chunk size line with its extensions (which are skipped).
	maxChunkLine = 4 << 10
	// maxTrailerBytes bounds the trailer section after the last chunk (skipped; the relay
	// uses no trailer), as the response headers are bounded by the read buffer.
	maxTrailerBytes = 4 << 10
)

// chunkState is where a chunkDecoder is in the framing.
type chunkState uint8

const (
	csSize      chunkState = iota // the chunk size's hex digits
	csExt                         // after the size: whitespace, then an extension, up to the CR
	csExtText                     // inside an extension, up to the CR
	csSizeLF                      // the size line's LF
	csData                        // the chunk's data
	csDataCR                      // the CR after the data
	csDataLF                      // the LF after the data
	csTrailer                     // a trailer line (or the blank line that ends the body)
	csTrailerLF                   // a trailer line's LF
	csDone                        // the body has ended
)

// chunkDecoder decodes an HTTP/1.1 chunked body (RFC 9112 section 7.1) fed in pieces cut
// anywhere: decode takes whatever one read of the connection brought, any number of chunks
// and parts of chunks, and moves their data to the front of the same buffer, so that the
// caller frames the data straight from its read buffer with no copy of its own. The state
// between two reads is a few integers: no byte of the framing is held back, so the read
// buffer can be any buffer at every read.
//
// Chunk sizes are hex digits read from the slice (a table per digit, at most 15 of them);
// extension text and trailers, which the router does not use, are skipped with vectorized
// scans for their CR and bounded. Line ends must be CRLF; a bare LF anywhere in the framing
// is refused (as fasthttp's client does: it is how requests are smuggled past proxies).
type chunkDecoder struct {
	state chunkState
	// left is the chunk's size while it is read, then the data left of the chunk.
	left int64
	// digits is the size's hex digits so far; line the size line's (or the trailers') bytes
	// so far, trailerLine the current trailer line's.
	digits      int
	line        int
	trailerLine int
}

// hexValue is each byte's value as a hex digit, -1 for a byte that is none.
var hexValue = func() (t [256]int8) {
	for i := range t {
		t[i] = -1
	}
	for c := '0'; c <= '9'; c++ {
		t[c] = int8(c - '0')
	}
	for c := 'a'; c <= 'f'; c++ {
		t[c] = int8(c - 'a' + 10)
		t[c-'a'+'A'] = int8(c - 'a' + 10)
	}
	return t
}()

// done reports whether the body's end (the last chunk and the trailer section) was decoded.
func (d *chunkDecoder) done() bool { return d.state == csDone }

// decode consumes b, the body's next bytes, and moves the data of its chunks to b[:n]. used
// is how many bytes of b the body took: len(b) unless the body ended inside b (done), when
// the rest is bytes the engine sent past its answer. A malformed framing fails with an error
// wrapping ErrBadChunk; the data before it is in b[:n].
func (d *chunkDecoder) decode(b []byte) (n, used int, err error) {
	i := 0
	for i < len(b) {
		switch d.state {
		case csData:
			// Fast path: a run of data, moved down over the framing before it.
			k := len(b) - i
			if int64(k) > d.left {
				k = int(d.left)
			}
			if n != i {
				copy(b[n:], b[i:i+k])
			}
			n += k
			i += k
			if d.left -= int64(k); d.left == 0 {
				d.state = csDataCR
			}
		case csSize:
			v := hexValue[b[i]]
			if v < 0 {
				if d.digits == 0 {
					return n, i, errChunkSizeDigit
				}
				d.state = csExt
				continue
			}
			if d.digits == maxChunkSizeDigits {
				return n, i, errChunkSizeLong
			}
			d.left = d.left<<4 | int64(v)
			d.digits++
			d.line++
			i++
		case csExt:
			switch b[i] {
			case ' ', '\t':
			case ';':
				d.state = csExtText
			case '\r':
				d.state = csSizeLF
			case '\n':
				return n, i, errChunkLineLF
			default:
				return n, i, errChunkSizeChar
			}
			if d.line++; d.line > maxChunkLine {
				return n, i, errChunkLineLong
			}
			i++
		case csExtText:
			// An extension's text, skipped up to its CR.
			text, found := upToCR(b[i:])
			if bytes.IndexByte(text, '\n') >= 0 {
				return n, i, errChunkLineLF
			}
			if d.line += len(text); d.line > maxChunkLine {
				return n, i, errChunkLineLong
			}
			i += len(text)
			if found {
				i++
				d.state = csSizeLF
			}
		case csSizeLF:
			if b[i] != '\n' {
				return n, i, errChunkLineCRLF
			}
			i++
			d.digits, d.line = 0, 0
			if d.left == 0 {
				d.state, d.trailerLine = csTrailer, 0 // the last chunk
			} else {
				d.state = csData
			}
		case csDataCR:
			if b[i] != '\r' {
				return n, i, errChunkCRLF
			}
			i++
			d.state = csDataLF
		case csDataLF:
			if b[i] != '\n' {
				return n, i, errChunkCRLF
			}
			i++
			d.state = csSize
		case csTrailer:
			text, found := upToCR(b[i:])
			if bytes.IndexByte(text, '\n') >= 0 {
				return n, i, errChunkLineLF
			}
			d.trailerLine += len(text)
			if d.line += len(text); d.line > maxTrailerBytes {
				return n, i, errTrailerLong
			}
			i += len(text)
			if found {
				i++
				d.state = csTrailerLF
			}
		case csTrailerLF:
			if b[i] != '\n' {
				return n, i, errChunkLineCRLF
			}
			i++
			if d.trailerLine == 0 {
				d.state = csDone // the blank line: the body's end
				return n, i, nil
			}
			if d.line += 2; d.line > maxTrailerBytes {
				return n, i, errTrailerLong
			}
			d.state, d.trailerLine = csTrailer, 0
		case csDone:
			return n, i, nil
		}
	}
	return n, i, nil
}

// upToCR returns b up to its first CR, and whether there is one.
func upToCR(b []byte) ([]byte, bool) {
	if j := bytes.IndexByte(b, '\r'); j >= 0 {
		return b[:j], true
	}
	return b, false
}

// ChunkedFraming follows a chunked body's framing through the reads that carry it without
// taking its data out: a proxy that relays the bytes as they came (the bench's event-loop
// proxy) learns where the body ends. The zero value is ready for a body's first byte; it is
// the chunkDecoder the streamed answers use, run on a copy of each read.
type ChunkedFraming struct{ d chunkDecoder }

// Feed follows the framing through b, which it leaves as it is; scratch is a buffer of at
// least len(b) bytes it may overwrite. used is how many bytes of b belong to the body
// (len(b) unless it ended inside b), done whether it has ended; a broken framing fails with
// an error wrapping ErrBadChunk.
func (f *ChunkedFraming) Feed(b, scratch []byte) (used int, done bool, err error) {
	s := scratch[:len(b)]
	copy(s, b)
	_, used, err = f.d.decode(s)
	return used, f.d.done(), err
}
