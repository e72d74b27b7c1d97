package engine

import (
	"errors"
	"testing"
)

func TestEngineGroupCandidates(t *testing.T) {
	plain := testWorkers(t, "llama", StagePlain, "p", 3)
	other := testWorkers(t, "qwen", StagePlain, "q", 2)
	dec := testWorkers(t, "llama", StageDecode, "d", 2)
	set := mustSet(t, plain, other, dec)
	tests := []struct {
		name    string
		stage   Stage
		members []string
		want    []*Worker
	}{
		{"absent membership is every healthy worker of model and stage", StagePlain, nil, plain},
		{"explicit membership", StagePlain, []string{plain[2].ID, plain[0].ID}, []*Worker{plain[0], plain[2]}},
		{"empty membership is none", StagePlain, []string{}, nil},
		{"membership of another role is filtered", StagePlain, []string{dec[0].ID, plain[1].ID}, []*Worker{plain[1]}},
		{"decode stage", StageDecode, nil, dec},
		{"unknown member ignored", StageDecode, []string{"nope"}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := NewEngineGroup("llama", tt.stage, tt.members, NewRoundRobin(nil, nil))
			got := g.Candidates(set.Load())
			if len(got) != len(tt.want) {
				t.Fatalf("got %v, want %v", got, tt.want)
			}
			for i := range got {
				if got[i] != tt.want[i] {
					t.Fatalf("got %v, want %v", got, tt.want)
				}
			}
		})
	}
}

func TestEngineGroupHealthAndMembershipChanges(t *testing.T) {
	ws := testWorkers(t, "llama", StagePlain, "w", 3)
	set := mustSet(t, ws)
	g := NewEngineGroup("llama", StagePlain, nil, NewRoundRobin(nil, nil))
	if n := len(g.Candidates(set.Load())); n != 3 {
		t.Fatalf("candidates = %d, want 3", n)
	}
	set.SetHealthy(ws[1].ID, false)
	c := g.Candidates(set.Load())
	if len(c) != 2 || c[0] != ws[0] || c[1] != ws[2] {
		t.Fatalf("after unhealthy: %v", c)
	}
	set.SetHealthy(ws[1].ID, true)
	if n := len(g.Candidates(set.Load())); n != 3 {
		t.Fatalf("after healthy again: %d", n)
	}
	removed := set.Remove(ws[0].ID)
	if removed != ws[0] {
		t.Fatalf("Remove returned %v", removed)
	}
	if c := g.Candidates(set.Load()); len(c) != 2 || c[0] != ws[1] {
		t.Fatalf("after remove: %v", c)
	}
	if err := set.Add(ws[1]); !errors.Is(err, ErrDuplicateWorker) {
		t.Fatalf("duplicate add: %v", err)
	}
}

func TestEngineGroupRejectsForeignPicks(t *testing.T) {
	ws := testWorkers(t, "llama", StagePlain, "w", 2)
	impostor := NewWorker(ws[0].ID, ws[0].URL, "llama", StagePlain, nil) // same ID, different *Worker
	outsider := NewWorker("zz", "http://127.0.0.1:2", "llama", StagePlain, nil)
	set := mustSet(t, ws)
	tests := []struct {
		name string
		pick *Worker
	}{
		{"same ID, different worker", impostor},
		{"worker not in the set", outsider},
		{"nil worker", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := &fixedPolicy{fn: func([]*Worker, *PickRequest) (Pick, error) { return Pick{Worker: tt.pick}, nil }}
			g := NewEngineGroup("llama", StagePlain, nil, p)
			_, err := g.Pick(set.Load(), "b", breq("llama", 1, -1))
			if !errors.Is(err, ErrOutsideCandidates) {
				t.Fatalf("err = %v, want outside candidates", err)
			}
		})
	}
}

func TestEngineGroupPassesRequestFacts(t *testing.T) {
	ws := testWorkers(t, "llama", StagePrefill, "w", 2)
	set := mustSet(t, ws)
	var seen PickRequest
	p := &fixedPolicy{fn: func(c []*Worker, req *PickRequest) (Pick, error) {
		seen = *req
		return Pick{Worker: c[0], Reason: "x"}, nil
	}}
	g := NewEngineGroup("llama", StagePrefill, nil, p)
	req := &BucketRequest{Model: "llama", InputTokens: 12, ExpectedPeak: 40, SessionKey: "s", RoutingKey: "k", TokenIDs: []uint32{1, 2}}
	got, err := g.Pick(set.Load(), "bk", req)
	if err != nil || got.Worker != ws[0] {
		t.Fatalf("pick = %v, %v", got, err)
	}
	if seen.Stage != StagePrefill || seen.BucketID != "bk" || seen.InputTokens != 12 || seen.ExpectedPeak != 40 ||
		seen.SessionKey != "s" || seen.RoutingKey != "k" || len(seen.TokenIDs) != 2 {
		t.Fatalf("policy saw %+v", seen)
	}
}

func TestEngineGroupEmptySkipsPolicy(t *testing.T) {
	set := mustSet(t)
	p := &fixedPolicy{fn: func(c []*Worker, _ *PickRequest) (Pick, error) { return Pick{Worker: c[0]}, nil }}
	g := NewEngineGroup("llama", StagePlain, nil, p)
	_, err := g.Pick(set.Load(), "b", breq("llama", 1, -1))
	if !errors.Is(err, ErrNoCandidates) || p.calls != 0 {
		t.Fatalf("err = %v, policy calls = %d", err, p.calls)
	}
	var pe *PickError
	if !errors.As(err, &pe) || pe.Stage != StagePlain || pe.BucketID != "b" {
		t.Fatalf("error lost its stage or bucket: %+v", pe)
	}
}

func TestEngineGroupWrongModelIsInvalidSignal(t *testing.T) {
	set := mustSet(t, testWorkers(t, "llama", StagePlain, "w", 1))
	g := NewEngineGroup("llama", StagePlain, nil, NewRoundRobin(nil, nil))
	if _, err := g.Pick(set.Load(), "b", breq("qwen", 1, -1)); !errors.Is(err, ErrInvalidSignal) {
		t.Fatalf("err = %v", err)
	}
}
