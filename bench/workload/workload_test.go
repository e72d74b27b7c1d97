package workload

import (
	"errors"
	"reflect"
	"slices"
	"strings"
	"testing"

	"switchyard/tokenizer"
)

func TestTextHasExactTokenCount(t *testing.T) {
	tok := tokenizer.NewSimple()
	rng := newRNG(7, 0)
	for _, n := range []int{1, 2, 15, 16, 17, 1000} {
		if got := tok.Count(text(rng, n)); got != n {
			t.Errorf("text(%d) has %d tokens", n, got)
		}
	}
}

func TestGeneratorsAreSeeded(t *testing.T) {
	small := Config{
		SharedPrefix: SharedPrefixConfig{Groups: 3, PromptsPerGroup: 4, SystemPromptLen: 40, QuestionLen: 8, OutputLen: 4},
		MultiTurn:    MultiTurnConfig{Users: 3, Turns: 3, SystemPromptLen: 20, QuestionLen: 8, OutputLen: 4},
		LongContext:  LongContextConfig{Requests: 20},
		ZeroReuse:    ZeroReuseConfig{Requests: 5, PromptLen: 30},
	}
	for _, name := range Names() {
		t.Run(name, func(t *testing.T) {
			a, err := Build(name, small, 1)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := Build(name, small, 1)
			c, _ := Build(name, small, 2)
			if !reflect.DeepEqual(a, b) {
				t.Error("same seed gave different workloads")
			}
			if reflect.DeepEqual(a.Requests, c.Requests) {
				t.Error("different seeds gave the same workload")
			}
			for i, r := range a.Requests {
				if r.Index != i {
					t.Fatalf("request %d has index %d", i, r.Index)
				}
				if r.After >= i {
					t.Fatalf("request %d waits for a later request %d", i, r.After)
				}
			}
		})
	}
	if _, err := Build("nope", small, 1); !errors.Is(err, ErrUnknownWorkload) {
		t.Errorf("unknown workload: %v", err)
	}
}

func TestSharedPrefixShape(t *testing.T) {
	tok := tokenizer.NewSimple()
	w, err := SharedPrefix(SharedPrefixConfig{Groups: 3, PromptsPerGroup: 5, SystemPromptLen: 100, QuestionLen: 10, OutputLen: 7}, 1)
	if err != nil {
		t.Fatal(err)
	}
	if len(w.Requests) != 15 {
		t.Fatalf("%d requests, want 15", len(w.Requests))
	}
	systems := map[string]string{}
	perGroup := map[string]int{}
	for _, r := range w.Requests {
		if len(r.Messages) != 2 || r.MaxTokens != 7 || r.RoutingKey != r.Class || r.SessionID != "" || r.After != -1 {
			t.Fatalf("bad request %+v", r)
		}
		if n := tok.Count(r.Messages[0].Content); n != 100 {
			t.Errorf("system prompt of %d tokens", n)
		}
		if n := tok.Count(r.Messages[1].Content); n != 10 {
			t.Errorf("question of %d tokens", n)
		}
		if s, ok := systems[r.Class]; ok && s != r.Messages[0].Content {
			t.Errorf("group %s has two system prompts", r.Class)
		}
		systems[r.Class] = r.Messages[0].Content
		perGroup[r.Class]++
	}
	if len(systems) != 3 {
		t.Errorf("%d groups, want 3", len(systems))
	}
	for g, n := range perGroup {
		if n != 5 {
			t.Errorf("group %s has %d prompts", g, n)
		}
	}
	if got := w.Classes(); len(got) != 3 {
		t.Errorf("Classes() = %v", got)
	}
	// The order is shuffled: the first five requests are not all of one group.
	first := w.Requests[0].Class
	if !slices.ContainsFunc(w.Requests[:5], func(r Request) bool { return r.Class != first }) {
		t.Error("requests are not interleaved across groups")
	}
}

func TestMultiTurnHistoryGrows(t *testing.T) {
	tok := tokenizer.NewSimple()
	w, err := MultiTurn(MultiTurnConfig{Users: 4, Turns: 3, SystemPromptLen: 30, QuestionLen: 5, OutputLen: 6}, 3)
	if err != nil {
		t.Fatal(err)
	}
	if len(w.Requests) != 12 {
		t.Fatalf("%d requests", len(w.Requests))
	}
	prev := map[string]*Request{}
	for i := range w.Requests {
		r := &w.Requests[i]
		if r.SessionID != r.Class || r.RoutingKey != r.Class {
			t.Errorf("request %d: session %q routing key %q class %q", i, r.SessionID, r.RoutingKey, r.Class)
		}
		p, seen := prev[r.Class]
		if !seen {
			if r.After != -1 || len(r.Messages) != 2 {
				t.Errorf("first turn %d: after %d, %d messages", i, r.After, len(r.Messages))
			}
		} else {
			if r.After != p.Index {
				t.Errorf("request %d waits for %d, want its previous turn %d", i, r.After, p.Index)
			}
			if len(r.Messages) != len(p.Messages)+2 || !reflect.DeepEqual(r.Messages[:len(p.Messages)], p.Messages) {
				t.Errorf("request %d does not extend its previous turn", i)
			}
			answer := r.Messages[len(p.Messages)]
			if answer.Role != tokenizer.RoleAssistant || tok.Count(answer.Content) != 6 {
				t.Errorf("request %d: history answer %+v", i, answer)
			}
			// The previous prompt is a token prefix of this one.
			a, _ := p.Prompt(tok)
			b, _ := r.Prompt(tok)
			if len(b) <= len(a) || !slices.Equal(a, b[:len(a)]) {
				t.Errorf("request %d: the previous turn's prompt is not a token prefix", i)
			}
		}
		prev[r.Class] = r
	}
	// Turn-major order: every user's first turn comes before any second turn.
	for i := range 4 {
		if w.Requests[i].After != -1 {
			t.Errorf("request %d is not a first turn", i)
		}
	}
}

func TestLongContextClasses(t *testing.T) {
	tok := tokenizer.NewSimple()
	classes := []LengthClass{{Name: "a", Min: 10, Max: 20, Weight: 3}, {Name: "b", Min: 100, Max: 100, Weight: 1}}
	w, err := LongContext(LongContextConfig{Requests: 400, Classes: classes, OutputLen: 2}, 5)
	if err != nil {
		t.Fatal(err)
	}
	count := map[string]int{}
	for _, r := range w.Requests {
		n := tok.Count(r.Messages[0].Content)
		switch r.Class {
		case "a":
			if n < 10 || n > 20 {
				t.Errorf("class a prompt of %d tokens", n)
			}
		case "b":
			if n != 100 {
				t.Errorf("class b prompt of %d tokens", n)
			}
		default:
			t.Errorf("class %q", r.Class)
		}
		count[r.Class]++
	}
	// Weights 3:1 over 400 requests: a binomial with sd about 8.7; 60 is about 7 sd.
	if count["a"] < 240 || count["a"] > 360 {
		t.Errorf("class a has %d of 400 requests, want about 300", count["a"])
	}
}

func TestZeroReuseIsUnique(t *testing.T) {
	w, err := ZeroReuse(ZeroReuseConfig{Requests: 50, PromptLen: 32}, 1)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, r := range w.Requests {
		first := strings.Fields(r.Messages[0].Content)[:8]
		k := strings.Join(first, " ")
		if seen[k] {
			t.Errorf("two prompts start with %q", k)
		}
		seen[k] = true
	}
}

func TestGeneratorValidation(t *testing.T) {
	tests := []struct {
		name string
		run  func() error
		want []string
	}{
		{"shared prefix", func() error {
			_, err := SharedPrefix(SharedPrefixConfig{Groups: -1, QuestionLen: -2}, 1)
			return err
		}, []string{"shared_prefix.groups", "shared_prefix.question_len"}},
		{"multi turn", func() error {
			_, err := MultiTurn(MultiTurnConfig{Users: -1, Turns: -1}, 1)
			return err
		}, []string{"multi_turn.users", "multi_turn.turns"}},
		{"long context", func() error {
			_, err := LongContext(LongContextConfig{Classes: []LengthClass{{Name: "", Min: 5, Max: 2, Weight: 0}}}, 1)
			return err
		}, []string{"classes[0].max", "classes[0].name", "weights sum"}},
		{"zero reuse", func() error {
			_, err := ZeroReuse(ZeroReuseConfig{Requests: maxRequests + 1}, 1)
			return err
		}, []string{"exceed"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.run()
			if !errors.Is(err, ErrInvalidConfig) {
				t.Fatalf("err = %v, want ErrInvalidConfig", err)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error lacks %q: %v", w, err)
				}
			}
		})
	}
}
