package httpfront

import (
	"bytes"
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/klauspost/compress/flate"
	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/zlib"
	"github.com/klauspost/compress/zstd"
	brotli "github.com/molecule-man/go-brrr"
	"github.com/valyala/fasthttp"
)

// maxPooledBuf is the largest buffer returned to the pool; larger ones (a big prompt) are left
// to the garbage collector so that one huge request does not pin memory.
const maxPooledBuf = 1 << 20

// maxZstdWindow bounds the window a zstd body may ask for (the decoder's working memory).
const maxZstdWindow = 8 << 20

var errBodyTooLarge = errors.New("decompressed body exceeds the limit")

// bufPool holds *[]byte scratch buffers. It is process-wide but stateless (a cache), which
// STYLE allows for pools.
var bufPool = sync.Pool{New: func() any { b := make([]byte, 0, 4096); return &b }}

func getBuf() *[]byte { return bufPool.Get().(*[]byte) }

func putBuf(b *[]byte) {
	if b == nil || cap(*b) > maxPooledBuf {
		return
	}
	*b = (*b)[:0]
	bufPool.Put(b)
}

// decoders pools the decompressors of request bodies. Each decoder is used by one request at
// a time and reset between uses; memory per decoder is bounded (zstd window, brotli window).
type decoders struct {
	gzip   sync.Pool // *gzip.Reader
	zlib   sync.Pool // io.ReadCloser implementing zlib.Resetter
	flate  sync.Pool // io.ReadCloser implementing flate.Resetter
	brotli sync.Pool // *brotli.Reader
	zstd   sync.Pool // *zstd.Decoder
}

// encoding is a supported Content-Encoding.
type encoding uint8

const (
	encIdentity encoding = iota
	encGzip
	encDeflate
	encBrotli
	encZstd
	encUnknown
)

// parseEncoding maps a Content-Encoding header value to an encoding; case-insensitive, with
// surrounding spaces ignored. Lists of several codings are not supported (encUnknown).
func parseEncoding(v []byte) encoding {
	v = bytes.TrimSpace(v)
	switch {
	case len(v) == 0 || bytes.EqualFold(v, []byte("identity")):
		return encIdentity
	case bytes.EqualFold(v, []byte("gzip")) || bytes.EqualFold(v, []byte("x-gzip")):
		return encGzip
	case bytes.EqualFold(v, []byte("deflate")):
		return encDeflate
	case bytes.EqualFold(v, []byte("br")):
		return encBrotli
	case bytes.EqualFold(v, []byte("zstd")):
		return encZstd
	}
	return encUnknown
}

// decoderCost is the working memory a decompressor of enc may hold, charged to the body
// budget while it decodes: the window it keeps (zstd's capped at maxZstdWindow, brotli's up
// to 16 MiB, deflate's 32 KiB) and its block buffers.
func decoderCost(enc encoding) int64 {
	switch enc {
	case encZstd:
		return maxZstdWindow + 512<<10
	case encBrotli:
		return 16<<20 + 64<<10
	case encGzip, encDeflate:
		return 64 << 10
	}
	return 0
}

// reader returns a reader of src decompressed per enc, and the function that returns the
// decompressor to its pool once the caller is done. An identity enc returns src. The error
// is a malformed header.
func (d *decoders) reader(enc encoding, src io.Reader) (io.Reader, func(), error) {
	switch enc {
	case encGzip:
		zr, _ := d.gzip.Get().(*gzip.Reader)
		var err error
		if zr == nil {
			zr, err = gzip.NewReader(src)
		} else {
			err = zr.Reset(src)
		}
		if err != nil {
			return nil, nil, err
		}
		zr.Multistream(true)
		return zr, func() { d.gzip.Put(zr) }, nil
	case encDeflate:
		// HTTP "deflate" is zlib-wrapped (RFC 9110); some clients send raw deflate. The first
		// two bytes tell which.
		var head [2]byte
		n, err := io.ReadFull(src, head[:])
		if err != nil && !errors.Is(err, io.ErrUnexpectedEOF) {
			if errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF
			}
			return nil, nil, err
		}
		src = io.MultiReader(bytes.NewReader(head[:n]), src)
		if n == 2 && (uint16(head[0])<<8|uint16(head[1]))%31 == 0 && head[0]&0x0f == 8 {
			zr, _ := d.zlib.Get().(io.ReadCloser)
			if zr == nil {
				zr, err = zlib.NewReader(src)
			} else {
				err = zr.(zlib.Resetter).Reset(src, nil)
			}
			if err != nil {
				return nil, nil, err
			}
			return zr, func() { d.zlib.Put(zr) }, nil
		}
		fr, _ := d.flate.Get().(io.ReadCloser)
		if fr == nil {
			fr = flate.NewReader(src)
		} else if err := fr.(flate.Resetter).Reset(src, nil); err != nil {
			return nil, nil, err
		}
		return fr, func() { d.flate.Put(fr) }, nil
	case encBrotli:
		br, _ := d.brotli.Get().(*brotli.Reader)
		if br == nil {
			br = brotli.NewReader(src)
		} else {
			br.Reset(src)
		}
		return br, func() { d.brotli.Put(br) }, nil
	case encZstd:
		zd, _ := d.zstd.Get().(*zstd.Decoder)
		var err error
		if zd == nil {
			zd, err = zstd.NewReader(src, zstd.WithDecoderConcurrency(1),
				zstd.WithDecoderMaxWindow(maxZstdWindow), zstd.WithDecoderLowmem(true))
		} else {
			err = zd.Reset(src)
		}
		if err != nil {
			return nil, nil, err
		}
		return zd, func() {
			_ = zd.Reset(nil) // drop the request's stream
			d.zstd.Put(zd)
		}, nil
	}
	return src, func() {}, nil
}

// readLimited appends everything r yields to dst, failing with errBodyTooLarge once more than
// limit bytes were produced.
func readLimited(dst []byte, r io.Reader, limit int64) ([]byte, error) {
	start := len(dst)
	for {
		if len(dst) == cap(dst) {
			if int64(len(dst)-start) > limit {
				return dst, errBodyTooLarge
			}
			grow := max(cap(dst), 4096)
			if rem := limit + 1 - int64(len(dst)-start); int64(grow) > rem {
				grow = int(max(rem, 1))
			}
			dst = append(dst, make([]byte, grow)...)[:len(dst)]
		}
		n, err := r.Read(dst[len(dst):cap(dst)])
		dst = dst[:len(dst)+n]
		if int64(len(dst)-start) > limit {
			return dst, errBodyTooLarge
		}
		if err == io.EOF {
			return dst, nil
		}
		if err != nil {
			return dst, err
		}
	}
}

// bodyChunkSize is the unit in which a body of unknown length (chunked, or decompressed) is
// read and charged to the body budget.
const bodyChunkSize = 64 << 10

// chunkPool holds *[]byte buffers of bodyChunkSize. It is process-wide but stateless (a
// cache), which STYLE allows for pools.
var chunkPool = sync.Pool{New: func() any { b := make([]byte, bodyChunkSize); return &b }}

// bodyBudget is the router-wide budget of request-body bytes held in memory
// (server.max_body_bytes_in_flight): received bodies, their decompressed form and the
// decompressors' working memory. Acquiring is an atomic add when there is room (fast path);
// without room the caller waits up to its wait for a release (slow path).
type bodyBudget struct {
	limit   int64
	wait    time.Duration
	used    atomic.Int64
	waiters atomic.Int32
	mu      sync.Mutex
	// changed is closed (and dropped) when bytes are released while someone waits.
	changed chan struct{}
}

func newBodyBudget(limit int64, wait time.Duration) *bodyBudget {
	return &bodyBudget{limit: limit, wait: wait}
}

// tryAcquire takes n bytes if they fit.
func (b *bodyBudget) tryAcquire(n int64) bool {
	for {
		u := b.used.Load()
		if u+n > b.limit {
			return false
		}
		if b.used.CompareAndSwap(u, u+n) {
			return true
		}
	}
}

// acquire takes n bytes, waiting up to the budget's wait for room; it reports whether it
// got them.
func (b *bodyBudget) acquire(n int64) bool {
	if n <= 0 || b.tryAcquire(n) {
		return true
	}
	// Slow path: wait for releases.
	b.waiters.Add(1)
	defer b.waiters.Add(-1)
	t := time.NewTimer(b.wait)
	defer t.Stop()
	for {
		b.mu.Lock()
		if b.changed == nil {
			b.changed = make(chan struct{})
		}
		ch := b.changed
		b.mu.Unlock()
		if b.tryAcquire(n) {
			return true
		}
		select {
		case <-ch:
		case <-t.C:
			return false
		}
	}
}

// release returns n bytes.
func (b *bodyBudget) release(n int64) {
	if n <= 0 {
		return
	}
	b.used.Add(-n)
	if b.waiters.Load() > 0 {
		b.mu.Lock()
		if b.changed != nil {
			close(b.changed)
			b.changed = nil
		}
		b.mu.Unlock()
	}
}

var errBudget = errors.New("the request body budget is spent")

// readChunks reads src to its end into dst, at most limit bytes (errBodyTooLarge past it).
// It holds the body in pooled chunks while reading, then copies it into dst grown to its
// exact size. Both are charged to budget: first against prepaid, bytes the caller has
// already charged (readChunks takes them over), then by taking more without waiting, so a
// reader never waits while it holds budget; without room it fails with errBudget. It
// returns the body and the bytes still charged for it (its length), which the caller
// releases when done with the body; on an error nothing stays charged.
func readChunks(dst []byte, src io.Reader, limit int64, budget *bodyBudget, prepaid int64) ([]byte, int64, error) {
	charged := prepaid
	need := func(total int64) bool {
		if total <= charged {
			return true
		}
		if !budget.tryAcquire(total - charged) {
			return false
		}
		charged = total
		return true
	}
	var chunks [8]*[]byte // enough for 512 KiB without allocating
	list := chunks[:0]
	putChunks := func() {
		for _, c := range list {
			chunkPool.Put(c)
		}
	}
	var n int64
	var err error
	for {
		if n == int64(len(list))*bodyChunkSize {
			if n > limit {
				err = errBodyTooLarge
				break
			}
			if !need(n + bodyChunkSize) {
				err = errBudget
				break
			}
			list = append(list, chunkPool.Get().(*[]byte))
		}
		c := *list[len(list)-1]
		var m int
		m, err = src.Read(c[n%bodyChunkSize:])
		n += int64(m)
		if n > limit {
			err = errBodyTooLarge
			break
		}
		if err != nil {
			break
		}
	}
	if err == io.EOF && !need(int64(len(list))*bodyChunkSize+n) {
		err = errBudget
	}
	if err != io.EOF {
		putChunks()
		budget.release(charged)
		return dst[:0], 0, err
	}
	// The whole body, into dst grown to its size.
	if int64(cap(dst)) < n {
		dst = make([]byte, 0, n)
	}
	dst = dst[:0]
	for i, c := range list {
		end := min(n-int64(i)*bodyChunkSize, bodyChunkSize)
		dst = append(dst, (*c)[:end]...)
	}
	putChunks()
	budget.release(charged - n)
	return dst, n, nil
}

// maxUnreadBody is the unread rest of a request body that fasthttp drains by itself after
// the answer, keeping the connection; a longer one closes the connection.
const maxUnreadBody = 256 << 10

// bodyBudgetWait is how long a request waits for room in the body budget before its 503.
const bodyBudgetWait = time.Second

var errBudgetExhausted = newAPIError(CodeBodyBudget,
	"the router holds as many request bodies as server.max_body_bytes_in_flight allows; retry shortly")

// skipBody prepares an answer sent without reading the request body: when fasthttp would not
// drain the rest itself, the connection closes lingering, so that a client still sending
// reads the answer instead of a reset.
func skipBody(ctx *fasthttp.RequestCtx) {
	if cl := ctx.Request.Header.ContentLength(); cl == -1 || cl > maxUnreadBody {
		lingerClose(ctx)
	}
}

// countingReader reads at most n bytes of r (then io.EOF, with over set) and keeps r's last
// error.
type countingReader struct {
	r    io.Reader
	n    int64
	over bool
	err  error
}

func (c *countingReader) Read(p []byte) (int, error) {
	if c.n <= 0 {
		c.over = true
		return 0, io.EOF
	}
	if int64(len(p)) > c.n {
		p = p[:c.n]
	}
	m, err := c.r.Read(p)
	c.n -= int64(m)
	c.err = err
	return m, err
}

// readBody reads ctx's request body into dst: decompressed per its Content-Encoding, at most
// limit bytes before and after decompression, charged to the body budget. It returns the
// body and the bytes charged, which the caller releases once done with the body. On an
// error answer the rest of the body stays unread and the connection closes, lingering.
func (s *Server) readBody(ctx *fasthttp.RequestCtx, dst []byte, limit int64) ([]byte, int64, *apiError) {
	h := &ctx.Request.Header
	enc := encIdentity
	if v := h.ContentEncoding(); len(v) > 0 {
		if enc = parseEncoding(v); enc == encUnknown {
			skipBody(ctx)
			return dst[:0], 0, newAPIError(CodeUnsupportedEncoding, "unsupported Content-Encoding "+
				quoteClient(v)+" (use gzip, deflate, br or zstd)")
		}
	}
	cl := int64(h.ContentLength())
	if cl > limit {
		skipBody(ctx)
		return dst[:0], 0, errTooLarge
	}
	src := ctx.RequestBodyStream()
	if src == nil || cl == 0 || cl < -1 {
		return dst[:0], 0, nil // no body
	}
	if enc == encIdentity && cl > 0 {
		// Fast path: a known length, read in place.
		if !s.budget.acquire(cl) {
			lingerClose(ctx)
			return dst[:0], 0, errBudgetExhausted
		}
		if int64(cap(dst)) < cl {
			dst = make([]byte, cl)
		}
		dst = dst[:cl]
		if _, err := io.ReadFull(src, dst); err != nil {
			s.budget.release(cl)
			ctx.SetConnectionClose()
			return dst[:0], 0, bodyReadError(err)
		}
		return dst, cl, nil
	}
	// Slow path: a chunked or compressed body of unknown size. Admission charges (waiting
	// for room) the decompressor's working memory and room for an expected body: the body
	// as it arrives, or 32 times a compressed body, up to the cap, twice (chunks, then the
	// copy). Past that the read takes more only when it is free at once.
	expect := min(limit, 1<<20)
	if cl > 0 {
		expect = min(limit, cl*32)
	}
	cost, prepaid := decoderCost(enc), 2*expect
	if !s.budget.acquire(cost + prepaid) {
		lingerClose(ctx)
		return dst[:0], 0, errBudgetExhausted
	}
	defer s.budget.release(cost)
	raw := &countingReader{r: src, n: limit}
	rd, put, err := s.dec.reader(enc, raw)
	var held int64
	if err == nil {
		dst, held, err = readChunks(dst, rd, limit, s.budget, prepaid)
		put()
	} else {
		s.budget.release(prepaid)
	}
	switch {
	case err == nil && !raw.over:
		return dst, held, nil
	case raw.over || errors.Is(err, errBodyTooLarge):
		if err == nil {
			s.budget.release(held)
		}
		lingerClose(ctx)
		return dst[:0], 0, errTooLarge
	case errors.Is(err, errBudget):
		lingerClose(ctx)
		return dst[:0], 0, errBudgetExhausted
	case raw.err != nil && raw.err != io.EOF:
		ctx.SetConnectionClose()
		return dst[:0], 0, bodyReadError(raw.err)
	}
	lingerClose(ctx)
	return dst[:0], 0, newAPIError(CodeInvalidEncoding, "cannot decode the "+quoteClient(h.ContentEncoding())+
		" body: "+err.Error())
}

// bodyReadError is the answer to a body the client did not finish sending.
func bodyReadError(err error) *apiError {
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return newAPIError(CodeRequestTimeout, "the request body did not arrive in time")
	}
	return newAPIError(CodeMalformedRequest, "the request body ended early or is malformed: "+err.Error())
}
