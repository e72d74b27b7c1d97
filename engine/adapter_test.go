package engine

import (
	"errors"
	"testing"
)

func TestAdapterSet(t *testing.T) {
	var none *AdapterSet
	if none.Has("a") || !none.Free() || none.Names() != nil {
		t.Fatal("a nil set holds nothing and has room")
	}
	s := NewAdapterSet([]string{"b", "a", "b"}, 2)
	if !s.Has("a") || !s.Has("b") || s.Has("c") || s.Free() || len(s.Names()) != 2 {
		t.Fatalf("set %v slots %d", s.Names(), s.Slots)
	}
	if s.With("a") != s {
		t.Fatal("With of a held adapter made a new set")
	}
	if u := NewAdapterSet(nil, 0).With("x"); !u.Has("x") || !u.Free() {
		t.Fatal("an unbounded set")
	}
	w := NewWorker("w", "http://127.0.0.1:1", "llama", StagePlain, nil)
	w.AddAdapter("x")
	w.AddAdapter("x")
	if got := w.Adapters().Names(); len(got) != 1 || got[0] != "x" {
		t.Fatalf("worker adapters %v", got)
	}
}

func TestGroupAdapterCandidates(t *testing.T) {
	ws := testWorkers(t, "llama", StagePlain, "w", 4)
	ws[1].SetAdapters(NewAdapterSet([]string{"sql"}, 2))
	ws[2].SetAdapters(NewAdapterSet([]string{"sql", "math"}, 2))
	ws[3].SetAdapters(NewAdapterSet([]string{"code", "chat"}, 2)) // full
	reg, _ := NewRegistry(ws)
	req := func(adapter string) *BucketRequest {
		return &BucketRequest{Model: "llama", ExpectedPeak: -1, Adapter: adapter}
	}
	t.Run("holders only, by the policy", func(t *testing.T) {
		g := NewEngineGroup("llama", StagePlain, nil, NewRoundRobin(nil, nil))
		seen := map[*Worker]int{}
		for range 6 {
			p, err := g.Pick(reg, "b", req("sql"))
			if err != nil || p.LoadAdapter {
				t.Fatalf("%+v %v", p, err)
			}
			seen[p.Worker]++
		}
		if seen[ws[1]] != 3 || seen[ws[2]] != 3 {
			t.Fatalf("picks %v: want w1 and w2 in turn", seen)
		}
	})
	t.Run("no holder, no loading", func(t *testing.T) {
		g := NewEngineGroup("llama", StagePlain, nil, NewRoundRobin(nil, nil))
		_, err := g.Pick(reg, "b", req("poems"))
		if !errors.Is(err, ErrNoCandidates) {
			t.Fatalf("err = %v", err)
		}
	})
	t.Run("no holder, loading onto a free slot", func(t *testing.T) {
		g := NewEngineGroup("llama", StagePlain, nil, NewRoundRobin(nil, nil))
		g.SetAdapterLoading(true)
		for range 4 {
			p, err := g.Pick(reg, "b", req("poems"))
			if err != nil || !p.LoadAdapter || p.Worker == ws[2] || p.Worker == ws[3] {
				t.Fatalf("%+v %v: want a load on w0 (nothing learned) or w1 (a free slot)", p, err)
			}
		}
		// Every slot full: nothing to load onto.
		for _, w := range ws {
			w.SetAdapters(NewAdapterSet([]string{"x", "y"}, 2))
		}
		if _, err := g.Pick(reg, "b", req("poems")); !errors.Is(err, ErrNoCandidates) {
			t.Fatalf("full slots: %v", err)
		}
	})
}
