package indexer

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/valyala/fasthttp"

	"switchyard/kv"
)

// Remote source defaults.
const (
	DefaultQueryTimeout = 100 * time.Millisecond
	DefaultMaxInflight  = 32
)

// maxInterned bounds RemoteSource's interned worker IDs.
const maxInterned = 4096

// RemoteConfig configures a RemoteSource.
type RemoteConfig struct {
	// URL is the indexer's base URL, e.g. "http://127.0.0.1:9400". Required.
	URL string
	// Timeout bounds one lookup (further bounded by the caller's context). Default
	// DefaultQueryTimeout (100 ms).
	Timeout time.Duration
	// MaxInflight bounds concurrent lookups; one more fails at once as unavailable (it is
	// not queued). Default DefaultMaxInflight (32).
	MaxInflight int
	// Client sends the queries. Default: a new fasthttp.Client.
	Client *fasthttp.Client
	// Metrics receives lookup metrics (source="remote"). Default: a private set.
	Metrics *kv.Metrics
}

// RemoteSource is the CacheSource of a `switchyard indexer`: every lookup is one HTTP POST of
// the binary query (see AppendQuery). Timeouts, connection failures, 5xx, 413 and the
// in-flight limit make a lookup unavailable (a miss that stays distinguishable); a 400 means
// the indexer rejected the query. Safe for concurrent use.
type RemoteSource struct {
	uri     string
	timeout time.Duration
	client  *fasthttp.Client
	sem     chan struct{}
	m       *kv.Metrics
	bufs    sync.Pool // *[]byte

	internMu sync.RWMutex
	interned map[string]string
}

var _ kv.CacheSource = (*RemoteSource)(nil)

// NewRemoteSource validates cfg and returns a client.
func NewRemoteSource(cfg RemoteConfig) (*RemoteSource, error) {
	u, err := url.Parse(cfg.URL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("cannot create remote prefix source: URL %q is not an http(s) base URL", cfg.URL)
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = DefaultQueryTimeout
	}
	if cfg.MaxInflight <= 0 {
		cfg.MaxInflight = DefaultMaxInflight
	}
	if cfg.Client == nil {
		cfg.Client = &fasthttp.Client{
			Name:                "switchyard",
			MaxConnsPerHost:     cfg.MaxInflight,
			MaxResponseBodySize: 64 << 20,
			ReadTimeout:         10 * cfg.Timeout,
			WriteTimeout:        10 * cfg.Timeout,
		}
	}
	if cfg.Metrics == nil {
		cfg.Metrics = kv.NewMetrics(nil)
	}
	r := &RemoteSource{
		uri:      strings.TrimSuffix(cfg.URL, "/") + PathMatch,
		timeout:  cfg.Timeout,
		client:   cfg.Client,
		sem:      make(chan struct{}, cfg.MaxInflight),
		m:        cfg.Metrics,
		interned: map[string]string{},
	}
	r.bufs.New = func() any { b := make([]byte, 0, 4096); return &b }
	return r, nil
}

// Lookup implements CacheSource.
func (r *RemoteSource) Lookup(ctx context.Context, model string, tokens []uint32, dst *kv.Lookup) error {
	start := time.Now()
	err := r.lookup(ctx, model, tokens, dst)
	r.m.ObserveLookup(kv.SourceRemote, start, err)
	if err != nil {
		dst.Reset()
	}
	return err
}

var errInflight = errors.New("in-flight limit reached")

func (r *RemoteSource) lookup(ctx context.Context, model string, tokens []uint32, dst *kv.Lookup) error {
	if len(tokens) > MaxQueryTokens {
		return fmt.Errorf("cannot look up prefix: %w: %w: %d tokens", kv.ErrUnavailable, ErrQueryTooLarge, len(tokens))
	}
	timeout := r.timeout
	if dl, ok := ctx.Deadline(); ok {
		timeout = min(timeout, time.Until(dl))
	}
	if err := ctx.Err(); err != nil || timeout <= 0 {
		return fmt.Errorf("cannot look up prefix: %w: %w", kv.ErrUnavailable, context.DeadlineExceeded)
	}
	select {
	case r.sem <- struct{}{}:
	default:
		return fmt.Errorf("cannot look up prefix: %w: %w", kv.ErrUnavailable, errInflight)
	}
	defer func() { <-r.sem }()

	bp := r.bufs.Get().(*[]byte)
	body := AppendQuery((*bp)[:0], model, tokens)
	req := fasthttp.AcquireRequest()
	resp := fasthttp.AcquireResponse()
	defer func() {
		fasthttp.ReleaseRequest(req)
		fasthttp.ReleaseResponse(resp)
		if cap(body) <= 8<<20 {
			*bp = body[:0]
			r.bufs.Put(bp)
		}
	}()
	req.SetRequestURI(r.uri)
	req.Header.SetMethod(fasthttp.MethodPost)
	req.Header.SetContentType(ContentTypeBinary)
	req.Header.Set(HeaderRanks, "1") // an indexer that knows it answers each match's ranks
	req.SetBodyRaw(body)
	if err := r.client.DoTimeout(req, resp, timeout); err != nil {
		return fmt.Errorf("cannot look up prefix at %s: %w: %w", r.uri, kv.ErrUnavailable, err)
	}
	switch code := resp.StatusCode(); {
	case code == fasthttp.StatusOK:
	case code == fasthttp.StatusBadRequest:
		return fmt.Errorf("cannot look up prefix at %s: %w: %s", r.uri, kv.ErrRejected, truncate(resp.Body(), 200))
	default:
		return fmt.Errorf("cannot look up prefix at %s: %w: status %d", r.uri, kv.ErrUnavailable, code)
	}
	if err := DecodeAnswer(resp.Body(), dst, r.intern); err != nil {
		return fmt.Errorf("cannot look up prefix at %s: %w: %w", r.uri, kv.ErrUnavailable, err)
	}
	return nil
}

// intern returns a shared string for a worker ID, so that steady-state lookups do not
// allocate one per match.
func (r *RemoteSource) intern(b []byte) string {
	r.internMu.RLock()
	s, ok := r.interned[string(b)]
	r.internMu.RUnlock()
	if ok {
		return s
	}
	s = string(b)
	r.internMu.Lock()
	if len(r.interned) < maxInterned {
		r.interned[s] = s
	}
	r.internMu.Unlock()
	return s
}

func truncate(b []byte, n int) string {
	if len(b) > n {
		return string(b[:n]) + "…"
	}
	return string(b)
}
