package workload

import (
	"errors"
	"strings"
	"testing"
	"time"

	"switchyard/tokenizer"
)

// at is req(content) arriving at d with output tokens.
func at(content string, d time.Duration, output int) Request {
	r := req(content)
	r.At, r.MaxTokens = d, output
	return r
}

// instant is a fleet of engines × capacity tokens in pages of 16 whose requests finish as
// soon as they arrive unless they have output (one second a token).
func instant(engines, capacity int) FleetConfig {
	return FleetConfig{Engines: engines, CacheTokens: capacity, PageSize: 16, DecodeStep: time.Second}
}

func TestFleetOracleKnownInputs(t *testing.T) {
	a33, c33 := rep('a', 32)+"x", rep('c', 32)+"x" // two whole pages each
	tests := []struct {
		name       string
		reqs       []Request
		cfg        FleetConfig
		wantCached int64
	}{
		{"a repeat goes to its holder", []Request{at(a33, 0, 0), at(c33, 1, 0), at(a33, 2, 0)}, instant(2, 64), 32},
		// Two engines of two pages: c goes to the empty engine, so a survives there; one
		// pooled cache of four pages keeps both as well.
		{"a miss goes to the engine with free KV", []Request{at(a33, 0, 0), at(c33, 1, 0), at(a33, 2, 0)}, instant(2, 32), 32},
		// One engine of two pages: c evicts a (the pooled oracle of the same capacity too).
		{"an engine holds no more than its capacity", []Request{at(a33, 0, 0), at(c33, 1, 0), at(a33, 2, 0)}, instant(1, 32), 0},
		// A prompt of three whole pages on engines of two: the engine keeps its first two once
		// the request ends (the pooled cache of 4 pages would keep all three: 48).
		{"a prompt larger than one engine keeps what fits", []Request{at(rep('a', 48)+"x", 0, 0), at(rep('a', 48)+"x", 1, 0)}, instant(2, 32), 32},
		// b (one page) reserves two pages for its output while a's two pages are cached: a's
		// leaf page is evicted; b's output pages fill the room its reservation leaves.
		{"output reservations and output pages take history's room",
			[]Request{at(a33, 0, 0), at(rep('b', 16)+"x", 1, 32), at(a33, time.Minute, 0)}, instant(1, 64), 16},
		// The same without output: a keeps both pages.
		{"without output nothing is displaced",
			[]Request{at(a33, 0, 0), at(rep('b', 16)+"x", 1, 0), at(a33, time.Minute, 0)}, instant(1, 64), 32},
		// c arrives while a runs (its output takes a minute): a's pages are pinned, so c's
		// pages overflow instead of evicting them; once both end the older (a's) go first.
		{"running requests' pages are not evicted",
			[]Request{at(a33, 0, 60), at(c33, time.Second, 0), at(a33, 2*time.Second, 0)}, instant(1, 32), 32},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := FleetOracle(tt.reqs, ids{}, tt.cfg)
			if err != nil {
				t.Fatal(err)
			}
			if got.CachedTokens != tt.wantCached || got.Requests != len(tt.reqs) {
				t.Fatalf("got %+v, want %d cached", got, tt.wantCached)
			}
		})
	}
}

func TestFleetOracleHoldsByCostModel(t *testing.T) {
	// One engine of four pages. a (2 pages) runs 33 ms of prefill and 2 output tokens of 1 s
	// each; b (2 pages and 1 reserved for output) arrives at 1 s and runs 16 s. A third
	// request repeats a at 3 s.
	a33, b33 := rep('a', 32)+"x", rep('b', 32)+"x"
	cfg := instant(1, 64)
	cfg.PrefillPerToken = time.Millisecond
	reqs := []Request{at(a33, 0, 2), at(b33, time.Second, 16), at(a33, 3*time.Second, 0)}
	tests := []struct {
		scale float64
		want  int64
	}{
		// a ends at 2.033 s beside b, which is pinned: a's leaf page goes to fit the capacity.
		{1, 16},
		// At twice the rate the repeat arrives at 1.5 s, while a still runs: both pages hit.
		{2, 32},
	}
	for _, tt := range tests {
		cfg.TimeScale = tt.scale
		got, err := FleetOracle(reqs, ids{}, cfg)
		if err != nil {
			t.Fatal(err)
		}
		if got.CachedTokens != tt.want {
			t.Errorf("time scale %g: cached %d, want %d", tt.scale, got.CachedTokens, tt.want)
		}
	}
}

func TestFleetOracleOneEngineIsPooled(t *testing.T) {
	// Conversations on one engine whose requests end as they arrive: the fleet oracle is the
	// pooled oracle of the same capacity.
	var reqs []Request
	for turn := range 6 {
		for u := range 12 {
			reqs = append(reqs, at(rep(byte('a'+u), 40*(turn+1))+"?", time.Duration(turn*12+u)*time.Second, 0))
		}
	}
	for _, capacity := range []int{1024, 2048, 4096} {
		f, err := FleetOracle(reqs, ids{}, instant(1, capacity))
		if err != nil {
			t.Fatal(err)
		}
		p, err := Oracle(reqs, ids{}, 16, capacity)
		if err != nil {
			t.Fatal(err)
		}
		if f.CachedTokens != p.CachedTokens || f.CachedTokens == 0 {
			t.Errorf("capacity %d: fleet %d cached, pooled %d", capacity, f.CachedTokens, p.CachedTokens)
		}
	}
}

func TestFleetOracleRejects(t *testing.T) {
	good := instant(2, 64)
	for name, mut := range map[string]func(*FleetConfig){
		"engines":    func(c *FleetConfig) { c.Engines = 0 },
		"page size":  func(c *FleetConfig) { c.PageSize = 0 },
		"capacity":   func(c *FleetConfig) { c.CacheTokens = 8 },
		"time scale": func(c *FleetConfig) { c.TimeScale = -1 },
	} {
		c := good
		mut(&c)
		_, err := FleetOracle([]Request{req("x")}, ids{}, c)
		if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), name) {
			t.Errorf("%s: err %v", name, err)
		}
	}
}

func TestFleetOracleOfTrace(t *testing.T) {
	w, err := ReadTrace(strings.NewReader(smallTrace), TraceConfig{BlockSize: 4}, 1)
	if err != nil {
		t.Fatal(err)
	}
	o, err := FleetOracle(w.Requests, tokenizer.NewSimple(), FleetConfig{Engines: 2, CacheTokens: 1024, PageSize: 4, TimeScale: 1,
		PrefillPerToken: time.Millisecond, DecodeStep: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	// As the pooled oracle (TestOracleOfTrace): line 4 goes to line 1's engine and hits 4.
	if o.PromptTokens != 25 || o.CachedTokens != 4 {
		t.Fatalf("oracle %+v", o)
	}
}
