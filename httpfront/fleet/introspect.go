package fleet

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/valyala/fasthttp"

	"switchyard/kv/subscribe"
	"switchyard/load"
)

// Engine routes the lifecycle asks, newest introspection route first.
const (
	PathServerInfo    = "/server_info"
	PathGetServerInfo = "/get_server_info"
	PathHealth        = "/health" // health.endpoint's default
)

// maxInfoBody bounds an introspection or health answer.
const maxInfoBody = 4 << 20

// errStatus is an introspection route's non-200 answer.
type errStatus struct {
	path   string
	status int
}

func (e *errStatus) Error() string { return fmt.Sprintf("%s answered %d", e.path, e.status) }

// Introspect asks the engine at baseURL for its server info with c: /server_info, then
// /get_server_info when the newer route fails. An engine answering 404 on both is
// ErrNoIntrospection (vLLM); every failure wraps ErrIntrospection.
func Introspect(ctx context.Context, c load.Doer, baseURL string, timeout time.Duration) (Info, error) {
	base := strings.TrimRight(baseURL, "/")
	var errs [2]error
	for i, p := range [...]string{PathServerInfo, PathGetServerInfo} {
		var info Info
		err := load.Fetch(ctx, c, base+p, "application/json", timeout, maxInfoBody, func(status int, body []byte) error {
			if status != fasthttp.StatusOK {
				return &errStatus{p, status}
			}
			var err error
			info, err = DecodeInfo(body)
			return err
		})
		if err == nil {
			return info, nil
		}
		if errors.Is(err, ErrIntrospection) {
			return Info{}, fmt.Errorf("%w (%s%s)", err, base, p) // a body we cannot read: no second try
		}
		errs[i] = err
	}
	var s1, s2 *errStatus
	if errors.As(errs[0], &s1) && errors.As(errs[1], &s2) && s1.status == fasthttp.StatusNotFound && s2.status == fasthttp.StatusNotFound {
		return Info{}, fmt.Errorf("%w at %s", ErrNoIntrospection, base)
	}
	return Info{}, fmt.Errorf("%w at %s: %w", ErrIntrospection, base, errs[0])
}

// KVDiscoverer finds an engine's KV-event publishers through the one introspection
// (subscribe.Discoverer), for `switchyard indexer`, which follows engines without a router's worker
// lifecycle. An engine without introspection routes or without a ZMQ publisher is
// subscribe.ErrNoKVEvents.
type KVDiscoverer struct {
	// Client sends the requests. Required.
	Client load.Doer
	// Timeout bounds one request. Default 2s.
	Timeout time.Duration
}

var _ subscribe.Discoverer = (*KVDiscoverer)(nil)

// DiscoverKV implements subscribe.Discoverer.
func (d *KVDiscoverer) DiscoverKV(ctx context.Context, workerURL string) (subscribe.Discovery, error) {
	timeout := d.Timeout
	if timeout <= 0 {
		timeout = 2 * time.Second
	}
	info, err := Introspect(ctx, d.Client, workerURL, timeout)
	if errors.Is(err, ErrNoIntrospection) {
		return subscribe.Discovery{}, fmt.Errorf("%w: %w", subscribe.ErrNoKVEvents, err)
	}
	if err != nil {
		return subscribe.Discovery{}, err
	}
	return info.KVDiscovery(workerURL)
}
