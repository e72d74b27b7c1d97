package retry

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strconv"
	"time"

	"switchyard/config"
)

// Kind classifies a failed dispatch attempt.
type Kind uint8

// Kinds of failure.
const (
	// KindTransport: the connection failed before the first response byte (refused, reset,
	// closed by the engine).
	KindTransport Kind = iota + 1
	// KindTimeout: no response byte arrived in time.
	KindTimeout
	// KindStatus: the engine answered an error status.
	KindStatus
)

// Failure is one dispatch attempt that failed before any response byte reached the client.
type Failure struct {
	Kind Kind
	// Status is the engine's answer, with KindStatus.
	Status int
}

// Reason is f's label in switchyard_retries_total{reason}: "transport", "timeout" or
// "status_<code>".
func (f Failure) Reason() string {
	switch f.Kind {
	case KindTransport:
		return "transport"
	case KindTimeout:
		return "timeout"
	case KindStatus:
		switch f.Status {
		case 500:
			return "status_500"
		case 502:
			return "status_502"
		case 503:
			return "status_503"
		case 504:
			return "status_504"
		}
		// Slow path: a configured status other than the common ones.
		return "status_" + strconv.Itoa(f.Status)
	}
	return "unknown"
}

// Policy is the retry rules of one router: whether a failure is retried, how often, and the
// wait before each retry. It is immutable and safe for concurrent use.
type Policy struct {
	maxRetries int // 0 when retries are off
	initial    float64
	max        float64 // seconds
	multiplier float64
	jitter     float64
	// statuses is the retryable status set: bit s-statusBase of codes 400..655.
	statuses [4]uint64
	random   func() float64
}

const statusBase = 400

// ErrInvalid is returned by New for settings config.Validate rejects.
var ErrInvalid = errors.New("invalid retry settings")

// New returns the policy of cfg. random returns uniform values in [0, 1) and must be safe for
// concurrent use; nil takes math/rand/v2's Float64. Settings that config.Validate rejects are
// an error wrapping ErrInvalid.
func New(cfg config.Retry, random func() float64) (*Policy, error) {
	if random == nil {
		random = rand.Float64
	}
	switch {
	case cfg.MaxRetries < 0 || cfg.MaxRetries > config.MaxRetries:
		return nil, fmt.Errorf("%w: max_retries %d outside 0..%d", ErrInvalid, cfg.MaxRetries, config.MaxRetries)
	case cfg.InitialBackoff <= 0 || cfg.MaxBackoff < cfg.InitialBackoff:
		return nil, fmt.Errorf("%w: backoff %s..%s", ErrInvalid, cfg.InitialBackoff, cfg.MaxBackoff)
	case !(cfg.BackoffMultiplier >= 1) || math.IsInf(cfg.BackoffMultiplier, 0):
		return nil, fmt.Errorf("%w: backoff_multiplier %g", ErrInvalid, cfg.BackoffMultiplier)
	case !(cfg.Jitter >= 0 && cfg.Jitter <= 1):
		return nil, fmt.Errorf("%w: jitter %g", ErrInvalid, cfg.Jitter)
	}
	p := &Policy{
		initial:    cfg.InitialBackoff.Seconds(),
		max:        cfg.MaxBackoff.Seconds(),
		multiplier: cfg.BackoffMultiplier,
		jitter:     cfg.Jitter,
		random:     random,
	}
	if cfg.Enabled {
		p.maxRetries = cfg.MaxRetries
	}
	for _, s := range cfg.RetryableStatuses {
		if s != 408 && s != 429 && (s < 500 || s > 599) {
			return nil, fmt.Errorf("%w: retryable status %d", ErrInvalid, s)
		}
		i := s - statusBase
		p.statuses[i/64] |= 1 << (i % 64)
	}
	return p, nil
}

// MaxRetries is how many times one request may be retried after its first attempt; 0 when
// retries are off.
func (p *Policy) MaxRetries() int { return p.maxRetries }

// Retryable reports whether f is retried: a transport failure or a timeout before the first
// byte always is, an engine status when it is in the configured set; nothing is when retries
// are off. The caller checks separately that no byte reached the client, the attempt count
// and the budget.
func (p *Policy) Retryable(f Failure) bool {
	if p.maxRetries == 0 {
		return false
	}
	switch f.Kind {
	case KindTransport, KindTimeout:
		return true
	case KindStatus:
		i := f.Status - statusBase
		return i >= 0 && i < 64*len(p.statuses) && p.statuses[i/64]&(1<<(i%64)) != 0
	}
	return false
}

// Backoff is the wait before retry number retry (1 for the first retry): the initial backoff
// times the multiplier to the power retry-1, capped at the maximum, spread by ± the jitter
// fraction, and never above the maximum.
func (p *Policy) Backoff(retry int) time.Duration {
	d := p.initial * math.Pow(p.multiplier, float64(max(retry, 1)-1))
	d = min(d, p.max)
	if p.jitter > 0 {
		d *= 1 + p.jitter*(2*p.random()-1)
	}
	d = max(0, min(d, p.max))
	return time.Duration(d * float64(time.Second))
}
