package load

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/valyala/fasthttp"
)

// ErrBodyTooLarge is wrapped by Fetch errors about a response body over its limit.
var ErrBodyTooLarge = errors.New("response body too large")

// Doer sends one HTTP request and waits for its response until deadline. *fasthttp.Client
// and *fasthttp.HostClient are Doers, and so is the worker lifecycle's per-engine client
// (httpfront/fleet), through which TLS settings and connection handling reach every GET.
type Doer interface {
	DoDeadline(req *fasthttp.Request, resp *fasthttp.Response, deadline time.Time) error
}

// Fetch is the router's one bounded HTTP GET of an engine route (introspection, health
// checks, load polls and scrapes): it sends GET url with c and the Accept header accept,
// waits at most timeout and never past ctx's deadline, reads at most maxBody bytes of the
// answer (a longer body is ErrBodyTooLarge, refused before it is buffered), and hands the
// status and body to use, which must not keep the body (a pooled buffer). The error is
// use's, or the request's wrapped as "cannot fetch URL: ...".
func Fetch(ctx context.Context, c Doer, url, accept string, timeout time.Duration, maxBody int,
	use func(status int, body []byte) error) error {
	return Send(ctx, c, fasthttp.MethodGet, url, nil, accept, timeout, maxBody, use)
}

// Send is Fetch for any method: a request body (nil: none) is sent as application/json.
// Errors read "cannot fetch URL: ..." whatever the method.
func Send(ctx context.Context, c Doer, method, url string, body []byte, accept string, timeout time.Duration, maxBody int,
	use func(status int, body []byte) error) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("cannot fetch %s: %w", url, err)
	}
	deadline := time.Now().Add(timeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	req := fasthttp.AcquireRequest()
	resp := fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.SetRequestURI(url)
	req.Header.SetMethod(method)
	req.Header.Set(fasthttp.HeaderAccept, accept)
	if body != nil {
		req.Header.SetContentType("application/json")
		req.SetBodyRaw(body)
	}
	// A streamed body is read under the limit below whatever the client's own limit is.
	resp.StreamBody = true
	if err := c.DoDeadline(req, resp, deadline); err != nil {
		return fmt.Errorf("cannot fetch %s: %w", url, err)
	}
	buf := fetchBufs.Get().(*[]byte)
	defer fetchBufs.Put(buf)
	got, err := readBody((*buf)[:0], resp, maxBody)
	if err != nil {
		return fmt.Errorf("cannot fetch %s: %w", url, err)
	}
	if cap(got) <= maxPooledFetch {
		*buf = got
	}
	return use(resp.StatusCode(), got)
}

// maxPooledFetch bounds the buffers Fetch keeps for the next fetch.
const maxPooledFetch = 1 << 20

// fetchBufs holds the buffers Fetch reads bodies into.
var fetchBufs = sync.Pool{New: func() any { b := make([]byte, 0, 16<<10); return &b }}

// readBody appends resp's body to dst, at most limit bytes, and closes its stream.
func readBody(dst []byte, resp *fasthttp.Response, limit int) ([]byte, error) {
	s := resp.BodyStream()
	if s == nil {
		if len(resp.Body()) > limit {
			return dst, fmt.Errorf("%w: over %d bytes", ErrBodyTooLarge, limit)
		}
		return append(dst, resp.Body()...), nil
	}
	defer resp.CloseBodyStream() //nolint:errcheck // nothing to do about a failed close
	if n := resp.Header.ContentLength(); n > limit {
		return dst, fmt.Errorf("%w: %d bytes announced, limit %d", ErrBodyTooLarge, n, limit)
	}
	for {
		if len(dst) == cap(dst) {
			dst = append(dst, 0)[:len(dst)]
		}
		n, err := s.Read(dst[len(dst):min(cap(dst), limit+1)])
		dst = dst[:len(dst)+n]
		if len(dst) > limit {
			return dst, fmt.Errorf("%w: over %d bytes", ErrBodyTooLarge, limit)
		}
		if err == io.EOF {
			return dst, nil
		}
		if err != nil {
			return dst, fmt.Errorf("cannot read the body: %w", err)
		}
	}
}
