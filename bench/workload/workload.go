package workload

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"time"

	"switchyard/tokenizer"
)

// Workload names, as written on the command line.
const (
	NameSharedPrefix = "shared_prefix"
	NameMultiTurn    = "multi_turn"
	NameLongContext  = "long_context"
	NameZeroReuse    = "zero_reuse"
)

// Names returns every workload name, in the order the harness documents them.
func Names() []string {
	return []string{NameSharedPrefix, NameMultiTurn, NameLongContext, NameZeroReuse}
}

// ErrInvalidConfig is wrapped by every configuration error of a generator.
var ErrInvalidConfig = errors.New("invalid workload configuration")

// ErrUnknownWorkload is wrapped when a workload name is not one of Names.
var ErrUnknownWorkload = errors.New("unknown workload")

// Request is one chat request of a workload. It is immutable once generated.
type Request struct {
	// Index is the request's position in its workload, from 0.
	Index int
	// Class labels the request within its workload: its prefix group ("g3"), its user
	// ("u7") or its length class ("long").
	Class string
	// Messages are the chat messages sent.
	Messages []tokenizer.Message
	// MaxTokens is the requested output length; the mock engine generates exactly this many.
	MaxTokens int
	// SessionID, when set, is sent in the session header (multi-turn users).
	SessionID string
	// RoutingKey, when set, is sent in the routing-key header.
	RoutingKey string
	// Tenant, when set, is sent in the tenant header.
	Tenant string
	// Model, when set, is the request's "model" field instead of the run's model (a LoRA
	// adapter's name).
	Model string
	// After is the index of the request that must complete before this one is sent (the
	// previous turn of a conversation), or -1.
	After int
	// Tokens, when set, is the prompt of a replayed trace request, generated at send time
	// (Messages is then empty): token IDs for the native /generate route, or chat text
	// when Tokens.Chat.
	Tokens *TokenPrompt
	// At is a replayed request's arrival time, from the first request's (Workload.Replay).
	At time.Duration
}

// Workload is an ordered, seeded list of requests.
type Workload struct {
	// Name is one of the Name* constants.
	Name string
	// Description states the shape in one line, e.g. "24 groups × 128 prompts, ...".
	Description string
	// Requests are sent in this order (subject to After).
	Requests []Request
	// Replay says the requests arrive open-loop at their At (a replayed trace) rather than
	// from closed-loop clients or a Poisson process.
	Replay bool
}

// Config holds every generator's configuration; Build uses the one its name selects.
type Config struct {
	SharedPrefix SharedPrefixConfig
	MultiTurn    MultiTurnConfig
	LongContext  LongContextConfig
	ZeroReuse    ZeroReuseConfig
}

// Build generates the named workload from c with seed.
func Build(name string, c Config, seed uint64) (*Workload, error) {
	switch name {
	case NameSharedPrefix:
		return SharedPrefix(c.SharedPrefix, seed)
	case NameMultiTurn:
		return MultiTurn(c.MultiTurn, seed)
	case NameLongContext:
		return LongContext(c.LongContext, seed)
	case NameZeroReuse:
		return ZeroReuse(c.ZeroReuse, seed)
	}
	return nil, fmt.Errorf("cannot build workload %q: %w (want one of %s)", name, ErrUnknownWorkload, strings.Join(Names(), ", "))
}

// Templater is what prompt rendering needs: the engine's tokenizer and chat template.
type Templater interface {
	tokenizer.Tokenizer
	tokenizer.ChatTemplater
}

// Prompt returns the token IDs the engine computes for r: its messages rendered with the
// chat template, then encoded; a trace request's token IDs as they are, or its chat text
// rendered and encoded.
func (r *Request) Prompt(t Templater) ([]uint32, error) {
	msgs := r.Messages
	if r.Tokens != nil {
		if !r.Tokens.Chat {
			return r.Tokens.AppendIDs(nil), nil
		}
		msgs = r.Tokens.Messages()
	}
	text, err := t.ApplyChatTemplate(msgs)
	if err != nil {
		return nil, fmt.Errorf("cannot render request %d: %w", r.Index, err)
	}
	return t.Encode(text), nil
}

// newRNG returns the generator's random source for seed; stream separates the generators so
// that equal seeds do not give related text across workloads.
func newRNG(seed, stream uint64) *rand.Rand {
	return rand.New(rand.NewPCG(seed, 0x5717c4ad^stream))
}

// words appends n words to b, separated by single spaces. Each word is three lowercase
// letters, which the built-in tokenizer encodes as exactly one token (with or without its
// leading space), so the text is n tokens long.
func words(b *strings.Builder, rng *rand.Rand, n int) {
	b.Grow(4 * n)
	for i := range n {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteByte(byte('a' + rng.IntN(26)))
		b.WriteByte(byte('a' + rng.IntN(26)))
		b.WriteByte(byte('a' + rng.IntN(26)))
	}
}

// text returns n tokens of random words.
func text(rng *rand.Rand, n int) string {
	var b strings.Builder
	words(&b, rng, n)
	return b.String()
}

// problems collects configuration errors with their field names.
type problems []error

func (p *problems) atLeast(field string, v, least int) {
	if v < least {
		*p = append(*p, fmt.Errorf("%w: %s: %d must be at least %d", ErrInvalidConfig, field, v, least))
	}
}

func (p *problems) err() error { return errors.Join(*p...) }

// maxRequests bounds the size of one generated workload.
const maxRequests = 1 << 20

func (p *problems) bounded(field string, n int) {
	if n > maxRequests {
		*p = append(*p, fmt.Errorf("%w: %s: %d requests exceed %d", ErrInvalidConfig, field, n, maxRequests))
	}
}

// shuffle permutes reqs with rng and renumbers them.
func shuffle(rng *rand.Rand, reqs []Request) {
	rng.Shuffle(len(reqs), func(i, j int) { reqs[i], reqs[j] = reqs[j], reqs[i] })
	for i := range reqs {
		reqs[i].Index = i
	}
}

// Classes returns the distinct request classes of w in first-seen order.
func (w *Workload) Classes() []string {
	var out []string
	for i := range w.Requests {
		if c := w.Requests[i].Class; !slices.Contains(out, c) {
			out = append(out, c)
		}
	}
	return out
}
