package workload

import (
	"fmt"
	"math"
	"strconv"

	"switchyard/tokenizer"
)

// SharedPrefixConfig shapes the shared-prefix workload: groups of prompts that share a
// system prompt, each with its own question (the knobs of the inference-perf shared_prefix
// workload). Lengths are in tokens of the built-in tokenizer. Zero fields take the defaults.
type SharedPrefixConfig struct {
	// Groups is the number of distinct system prompts. Default 32.
	Groups int
	// PromptsPerGroup is the number of questions per system prompt. Default 96.
	PromptsPerGroup int
	// SystemPromptLen is the shared system prompt's length. Default 2048.
	SystemPromptLen int
	// QuestionLen is each question's length. Default 128.
	QuestionLen int
	// OutputLen is each answer's length. Default 32.
	OutputLen int
}

func (c SharedPrefixConfig) withDefaults() SharedPrefixConfig {
	def(&c.Groups, 32)
	def(&c.PromptsPerGroup, 96)
	def(&c.SystemPromptLen, 2048)
	def(&c.QuestionLen, 128)
	def(&c.OutputLen, 32)
	return c
}

func def(v *int, d int) {
	if *v == 0 {
		*v = d
	}
}

// SharedPrefix generates Groups × PromptsPerGroup requests in a seeded random order. Request
// class is the group ("g0", "g1", ...), which is also sent as the routing key, so that
// sticky routing pins a group as an operator pinning a tenant would.
func SharedPrefix(c SharedPrefixConfig, seed uint64) (*Workload, error) {
	c = c.withDefaults()
	var p problems
	p.atLeast("shared_prefix.groups", c.Groups, 1)
	p.atLeast("shared_prefix.prompts_per_group", c.PromptsPerGroup, 1)
	p.atLeast("shared_prefix.system_prompt_len", c.SystemPromptLen, 1)
	p.atLeast("shared_prefix.question_len", c.QuestionLen, 1)
	p.atLeast("shared_prefix.output_len", c.OutputLen, 1)
	if c.Groups > 0 && c.PromptsPerGroup > 0 {
		p.bounded("shared_prefix", c.Groups*c.PromptsPerGroup)
	}
	if err := p.err(); err != nil {
		return nil, fmt.Errorf("cannot build workload %s: %w", NameSharedPrefix, err)
	}
	rng := newRNG(seed, 1)
	reqs := make([]Request, 0, c.Groups*c.PromptsPerGroup)
	for g := range c.Groups {
		system := text(rng, c.SystemPromptLen)
		class := "g" + strconv.Itoa(g)
		for range c.PromptsPerGroup {
			reqs = append(reqs, Request{
				Class: class,
				Messages: []tokenizer.Message{
					{Role: tokenizer.RoleSystem, Content: system},
					{Role: tokenizer.RoleUser, Content: text(rng, c.QuestionLen)},
				},
				MaxTokens:  c.OutputLen,
				RoutingKey: class,
				After:      -1,
			})
		}
	}
	shuffle(rng, reqs)
	return &Workload{
		Name: NameSharedPrefix,
		Description: fmt.Sprintf("%d groups × %d prompts; system prompt %d + question %d tokens, output %d",
			c.Groups, c.PromptsPerGroup, c.SystemPromptLen, c.QuestionLen, c.OutputLen),
		Requests: reqs,
	}, nil
}

// MultiTurnConfig shapes the multi-turn workload: users holding conversations whose history
// grows by one question and one answer per turn. Zero fields take the defaults.
type MultiTurnConfig struct {
	// Users is the number of conversations. Default 48.
	Users int
	// Turns is the number of requests per conversation. Default 10.
	Turns int
	// SystemPromptLen is each user's own system prompt length. Default 256.
	SystemPromptLen int
	// QuestionLen is each turn's new question length. Default 128.
	QuestionLen int
	// OutputLen is each answer's length; the history carries an answer of this length.
	// Default 64.
	OutputLen int
}

func (c MultiTurnConfig) withDefaults() MultiTurnConfig {
	def(&c.Users, 48)
	def(&c.Turns, 10)
	def(&c.SystemPromptLen, 256)
	def(&c.QuestionLen, 128)
	def(&c.OutputLen, 64)
	return c
}

// MultiTurn generates Users × Turns requests, turn by turn: every user's first turn (in a
// seeded random order), then every user's second turn, and so on. Turn t of a user carries
// the system prompt, the t previous questions with their answers, and a new question; it
// waits for turn t-1 (After). The session header and the routing key carry the user ("u3").
//
// The answers in the history are generated text of OutputLen tokens, not the engine's actual
// replies, so the workload does not depend on the responses and is the same for every policy;
// a turn's prompt is therefore a token prefix of the next turn's prompt, and the engine's
// cached output pages are not reused.
func MultiTurn(c MultiTurnConfig, seed uint64) (*Workload, error) {
	c = c.withDefaults()
	var p problems
	p.atLeast("multi_turn.users", c.Users, 1)
	p.atLeast("multi_turn.turns", c.Turns, 1)
	p.atLeast("multi_turn.system_prompt_len", c.SystemPromptLen, 1)
	p.atLeast("multi_turn.question_len", c.QuestionLen, 1)
	p.atLeast("multi_turn.output_len", c.OutputLen, 1)
	if c.Users > 0 && c.Turns > 0 {
		p.bounded("multi_turn", c.Users*c.Turns)
	}
	if err := p.err(); err != nil {
		return nil, fmt.Errorf("cannot build workload %s: %w", NameMultiTurn, err)
	}
	rng := newRNG(seed, 2)
	history := make([][]tokenizer.Message, c.Users)
	for u := range history {
		history[u] = []tokenizer.Message{{Role: tokenizer.RoleSystem, Content: text(rng, c.SystemPromptLen)}}
	}
	last := make([]int, c.Users) // index of each user's previous turn
	for u := range last {
		last[u] = -1
	}
	reqs := make([]Request, 0, c.Users*c.Turns)
	order := make([]int, c.Users)
	for u := range order {
		order[u] = u
	}
	for range c.Turns {
		rng.Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })
		for _, u := range order {
			user := "u" + strconv.Itoa(u)
			msgs := append(history[u], tokenizer.Message{Role: tokenizer.RoleUser, Content: text(rng, c.QuestionLen)})
			msgs = msgs[:len(msgs):len(msgs)] // the next turn appends to a copy
			reqs = append(reqs, Request{
				Index:      len(reqs),
				Class:      user,
				Messages:   msgs,
				MaxTokens:  c.OutputLen,
				SessionID:  user,
				RoutingKey: user,
				After:      last[u],
			})
			last[u] = len(reqs) - 1
			history[u] = append(msgs, tokenizer.Message{Role: tokenizer.RoleAssistant, Content: text(rng, c.OutputLen)})
		}
	}
	return &Workload{
		Name: NameMultiTurn,
		Description: fmt.Sprintf("%d users × %d turns; system prompt %d, question %d, answer %d tokens per turn",
			c.Users, c.Turns, c.SystemPromptLen, c.QuestionLen, c.OutputLen),
		Requests: reqs,
	}, nil
}

// LengthClass is one class of prompt lengths in the long-context mix.
type LengthClass struct {
	// Name labels the class ("short").
	Name string
	// Min and Max bound the prompt length, in tokens, inclusive.
	Min, Max int
	// Weight is the class's share of the requests (normalised over all classes).
	Weight float64
}

// LongContextConfig shapes the long-context mix: unique prompts whose lengths fall in a few
// classes, so that a bucketed deployment sends them to different buckets. Zero fields take
// the defaults.
type LongContextConfig struct {
	// Requests is the number of requests. Default 600.
	Requests int
	// Classes are the length classes. Default short 256–1536 (70%), medium 3072–6144 (20%),
	// long 12288–24576 (10%).
	Classes []LengthClass
	// OutputLen is each answer's length. Default 32.
	OutputLen int
}

// DefaultLengthClasses returns the default classes of the long-context mix.
func DefaultLengthClasses() []LengthClass {
	return []LengthClass{
		{Name: "short", Min: 256, Max: 1536, Weight: 0.7},
		{Name: "medium", Min: 3072, Max: 6144, Weight: 0.2},
		{Name: "long", Min: 12288, Max: 24576, Weight: 0.1},
	}
}

func (c LongContextConfig) withDefaults() LongContextConfig {
	def(&c.Requests, 600)
	def(&c.OutputLen, 32)
	if len(c.Classes) == 0 {
		c.Classes = DefaultLengthClasses()
	}
	return c
}

// LongContext generates Requests unique single-message prompts, each drawn from a class by
// weight and given a uniform length within the class. Class is the length class.
func LongContext(c LongContextConfig, seed uint64) (*Workload, error) {
	c = c.withDefaults()
	var p problems
	p.atLeast("long_context.requests", c.Requests, 1)
	p.atLeast("long_context.output_len", c.OutputLen, 1)
	p.bounded("long_context", c.Requests)
	total := 0.0
	for i, cl := range c.Classes {
		f := fmt.Sprintf("long_context.classes[%d]", i)
		p.atLeast(f+".min", cl.Min, 1)
		p.atLeast(f+".max", cl.Max, cl.Min)
		if !(cl.Weight >= 0) || math.IsInf(cl.Weight, 0) {
			p = append(p, fmt.Errorf("%w: %s.weight: %v must be a finite non-negative number", ErrInvalidConfig, f, cl.Weight))
		}
		if cl.Name == "" {
			p = append(p, fmt.Errorf("%w: %s.name: empty", ErrInvalidConfig, f))
		}
		total += cl.Weight
	}
	if !(total > 0) {
		p = append(p, fmt.Errorf("%w: long_context.classes: weights sum to %v", ErrInvalidConfig, total))
	}
	if err := p.err(); err != nil {
		return nil, fmt.Errorf("cannot build workload %s: %w", NameLongContext, err)
	}
	rng := newRNG(seed, 3)
	reqs := make([]Request, 0, c.Requests)
	desc := ""
	for i, cl := range c.Classes {
		if i > 0 {
			desc += ", "
		}
		desc += fmt.Sprintf("%s %d–%d (%.0f%%)", cl.Name, cl.Min, cl.Max, 100*cl.Weight/total)
	}
	for i := range c.Requests {
		x := rng.Float64() * total
		cl := c.Classes[len(c.Classes)-1]
		for _, k := range c.Classes {
			if x < k.Weight {
				cl = k
				break
			}
			x -= k.Weight
		}
		n := cl.Min + rng.IntN(cl.Max-cl.Min+1)
		reqs = append(reqs, Request{
			Index:     i,
			Class:     cl.Name,
			Messages:  []tokenizer.Message{{Role: tokenizer.RoleUser, Content: text(rng, n)}},
			MaxTokens: c.OutputLen,
			After:     -1,
		})
	}
	return &Workload{
		Name:        NameLongContext,
		Description: fmt.Sprintf("%d unique prompts: %s tokens; output %d", c.Requests, desc, c.OutputLen),
		Requests:    reqs,
	}, nil
}

// ZeroReuseConfig shapes the control workload: unique prompts that share nothing, so no
// policy can hit the cache. Zero fields take the defaults.
type ZeroReuseConfig struct {
	// Requests is the number of requests. Default 1000.
	Requests int
	// PromptLen is each prompt's length. Default 1024.
	PromptLen int
	// OutputLen is each answer's length. Default 32.
	OutputLen int
}

func (c ZeroReuseConfig) withDefaults() ZeroReuseConfig {
	def(&c.Requests, 1000)
	def(&c.PromptLen, 1024)
	def(&c.OutputLen, 32)
	return c
}

// ZeroReuse generates Requests unique single-message prompts of PromptLen tokens.
func ZeroReuse(c ZeroReuseConfig, seed uint64) (*Workload, error) {
	c = c.withDefaults()
	var p problems
	p.atLeast("zero_reuse.requests", c.Requests, 1)
	p.atLeast("zero_reuse.prompt_len", c.PromptLen, 1)
	p.atLeast("zero_reuse.output_len", c.OutputLen, 1)
	p.bounded("zero_reuse", c.Requests)
	if err := p.err(); err != nil {
		return nil, fmt.Errorf("cannot build workload %s: %w", NameZeroReuse, err)
	}
	rng := newRNG(seed, 4)
	reqs := make([]Request, 0, c.Requests)
	for i := range c.Requests {
		reqs = append(reqs, Request{
			Index:     i,
			Class:     "unique",
			Messages:  []tokenizer.Message{{Role: tokenizer.RoleUser, Content: text(rng, c.PromptLen)}},
			MaxTokens: c.OutputLen,
			After:     -1,
		})
	}
	return &Workload{
		Name:        NameZeroReuse,
		Description: fmt.Sprintf("%d unique prompts of %d tokens; output %d", c.Requests, c.PromptLen, c.OutputLen),
		Requests:    reqs,
	}, nil
}
