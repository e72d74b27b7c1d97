package httpfront

import (
	"bytes"
	"errors"
	"io"
	"sync"

	"github.com/klauspost/compress/flate"
	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/zlib"
	"github.com/klauspost/compress/zstd"
	brotli "github.com/molecule-man/go-brrr"
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

// decode appends the decompression of body to dst, refusing output beyond limit bytes with
// errBodyTooLarge as soon as it is exceeded: memory stays bounded by limit however much the
// body would expand. Other failures are malformed input.
func (d *decoders) decode(dst []byte, enc encoding, body []byte, limit int64) ([]byte, error) {
	src := bytes.NewReader(body)
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
			return dst, err
		}
		zr.Multistream(true)
		dst, err = readLimited(dst, zr, limit)
		d.gzip.Put(zr)
		return dst, err
	case encDeflate:
		// HTTP "deflate" is zlib-wrapped (RFC 9110); some clients send raw deflate.
		if len(body) >= 2 && (uint16(body[0])<<8|uint16(body[1]))%31 == 0 && body[0]&0x0f == 8 {
			zr, _ := d.zlib.Get().(io.ReadCloser)
			var err error
			if zr == nil {
				zr, err = zlib.NewReader(src)
			} else {
				err = zr.(zlib.Resetter).Reset(src, nil)
			}
			if err != nil {
				return dst, err
			}
			dst, err = readLimited(dst, zr, limit)
			d.zlib.Put(zr)
			return dst, err
		}
		fr, _ := d.flate.Get().(io.ReadCloser)
		if fr == nil {
			fr = flate.NewReader(src)
		} else if err := fr.(flate.Resetter).Reset(src, nil); err != nil {
			return dst, err
		}
		dst, err := readLimited(dst, fr, limit)
		d.flate.Put(fr)
		return dst, err
	case encBrotli:
		br, _ := d.brotli.Get().(*brotli.Reader)
		if br == nil {
			br = brotli.NewReader(src)
		} else {
			br.Reset(src)
		}
		dst, err := readLimited(dst, br, limit)
		d.brotli.Put(br)
		return dst, err
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
			return dst, err
		}
		dst, err = readLimited(dst, zd, limit)
		d.zstd.Put(zd)
		return dst, err
	}
	return append(dst, body...), nil
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
