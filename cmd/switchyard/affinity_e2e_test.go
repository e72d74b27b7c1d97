package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"

	"switchyard/bench/mockengine"
	"switchyard/config"
	"switchyard/httpfront"
)

const affModel = "switchyard-mock"

// affEngine starts a zero-cost mock engine named id (no ZMQ publishers) and closes it when
// the test ends.
func affEngine(t *testing.T, id string) *mockengine.Engine {
	t.Helper()
	e, err := mockengine.Start(context.Background(), mockengine.Config{
		WorkerID: id, Model: affModel, ZeroCost: true,
		KVEvents: mockengine.KVEvents{Disabled: true}, LoadPublish: mockengine.LoadPublish{Disabled: true},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Close() })
	return e
}

// affBucket is one plain bucket of the test configuration.
type affBucket struct {
	id      string
	rank    int
	max     int64
	engines []*mockengine.Engine
	policy  config.Policy
}

// affRouter starts a router over the buckets (every engine a plain worker) and stops it when
// the test ends. It returns the router's base URL and the server.
func affRouter(t *testing.T, buckets ...affBucket) (string, *httpfront.Server) {
	t.Helper()
	cfg := config.Default()
	m := config.Model{}
	for _, b := range buckets {
		var ids []string
		for _, e := range b.engines {
			cfg.Workers = append(cfg.Workers, config.Worker{ID: e.WorkerID(), URL: e.URL(), Model: affModel, Role: config.RolePlain, DPSize: 1})
			ids = append(ids, e.WorkerID())
		}
		maxIn, pol := b.max, b.policy
		m.Buckets = append(m.Buckets, config.Bucket{ID: b.id, Rank: b.rank, Limits: config.Limits{Max: &maxIn},
			Groups: config.Groups{Plain: &config.Group{WorkerIDs: &ids, Policy: &pol}}})
	}
	cfg.Models = map[string]config.Model{affModel: m}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv, err := httpfront.New(cfg, httpfront.Options{Listener: ln, SkipStartupChecks: true, Seed: 1})
	if err != nil {
		_ = ln.Close()
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("router stopped with %v", err)
		}
	})
	base := "http://" + ln.Addr().String()
	waitReady(t, base)
	return base, srv
}

type affMessage struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

// affReply is what a chat answer tells the test.
type affReply struct {
	worker, bucket string
	content        string
	cached         int
}

// affChat sends one chat request with the session header and returns the answer.
func affChat(ctx context.Context, t *testing.T, base, session string, msgs []affMessage) affReply {
	t.Helper()
	body, _ := json.Marshal(map[string]any{"model": affModel, "messages": msgs, "max_tokens": 8})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/chat/completions", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("x-session-id", session)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d: %s", resp.StatusCode, raw)
	}
	var out struct {
		Choices []struct {
			Message affMessage `json:"message"`
		} `json:"choices"`
		Usage struct {
			PromptTokensDetails struct {
				CachedTokens int `json:"cached_tokens"`
			} `json:"prompt_tokens_details"`
		} `json:"usage"`
	}
	if err := json.Unmarshal(raw, &out); err != nil || len(out.Choices) == 0 {
		t.Fatalf("cannot decode %s: %v", raw, err)
	}
	return affReply{worker: resp.Header.Get("X-Switchyard-Worker"), bucket: resp.Header.Get("X-Switchyard-Bucket"),
		content: out.Choices[0].Message.Content, cached: out.Usage.PromptTokensDetails.CachedTokens}
}

func userTurn(i int) affMessage {
	return affMessage{Role: "user", Content: fmt.Sprintf("turn %d: %s", i,
		strings.Repeat(fmt.Sprintf("please summarise the previous answer and add detail number %d ", i), 6))}
}

// TestAffinitySessionStaysOnItsEngine: ten turns of one chat land on one engine of four and
// its cached prompt tokens grow every turn.
func TestAffinitySessionStaysOnItsEngine(t *testing.T) {
	engines := []*mockengine.Engine{affEngine(t, "E0"), affEngine(t, "E1"), affEngine(t, "E2"), affEngine(t, "E3")}
	base, _ := affRouter(t, affBucket{id: "all", rank: 10, max: 131072, engines: engines,
		policy: config.Policy{Type: config.PolicySessionAware}})
	var msgs []affMessage
	var home string
	prev := -1
	for turn := range 10 {
		msgs = append(msgs, userTurn(turn))
		r := affChat(context.Background(), t, base, "chat-42", msgs)
		if turn == 0 {
			home = r.worker
		}
		if r.worker != home || r.worker == "" {
			t.Fatalf("turn %d went to %q, the session's engine is %q", turn, r.worker, home)
		}
		if r.cached <= prev {
			t.Fatalf("turn %d: cached tokens %d, previous turn %d: want growth", turn, r.cached, prev)
		}
		t.Logf("turn %d: engine %s, cached tokens %d", turn, r.worker, r.cached)
		prev = r.cached
		msgs = append(msgs, affMessage{Role: "assistant", Content: r.content})
	}
}

// TestAffinityRejectedBindingMovesToNextBucket: when the session's bound engine is at its
// in-flight cap, its bucket rejects the request (no rebinding) and the next bucket serves
// it; once the engine drains, the session is back on it.
func TestAffinityRejectedBindingMovesToNextBucket(t *testing.T) {
	a0, a1, b0 := affEngine(t, "A0"), affEngine(t, "A1"), affEngine(t, "B0")
	one := int64(1)
	base, srv := affRouter(t,
		affBucket{id: "short", rank: 10, max: 4096, engines: []*mockengine.Engine{a0, a1},
			policy: config.Policy{Type: config.PolicySessionAware, Admission: config.Admission{MaxInflightRequests: &one}}},
		affBucket{id: "long", rank: 20, max: 131072, engines: []*mockengine.Engine{b0},
			policy: config.Policy{Type: config.PolicySessionAware}},
	)
	msgs := []affMessage{userTurn(0)}
	first := affChat(context.Background(), t, base, "s", msgs)
	if first.bucket != "short" {
		t.Fatalf("first request served by bucket %q", first.bucket)
	}
	bound := map[string]*mockengine.Engine{"A0": a0, "A1": a1}[first.worker]
	if bound == nil {
		t.Fatalf("first request served by %q", first.worker)
	}

	// Hold one request of the session on its engine: the engine is at its cap.
	if err := bound.SetFaults(mockengine.Faults{Hang: true}); err != nil {
		t.Fatal(err)
	}
	held := make(chan affReply, 1)
	go func() { held <- affChat(context.Background(), t, base, "s", msgs) }()
	w := srv.Workers().Worker(first.worker)
	waitFor(t, "the held request to reach its engine", func() (bool, string) {
		n := w.Counters.InFlight()
		return n >= 1, fmt.Sprintf("%d in flight", n)
	})
	moved := affChat(context.Background(), t, base, "s", msgs)
	if moved.bucket != "long" || moved.worker != "B0" {
		t.Fatalf("with the bound engine full: bucket %q worker %q, want long/B0", moved.bucket, moved.worker)
	}

	// Release the held request; the binding was kept, so the session returns to its engine.
	if err := bound.SetFaults(mockengine.Faults{}); err != nil {
		t.Fatal(err)
	}
	if r := <-held; r.worker != first.worker {
		t.Fatalf("the held request was served by %q", r.worker)
	}
	back := affChat(context.Background(), t, base, "s", msgs)
	if back.bucket != "short" || back.worker != first.worker {
		t.Fatalf("after the engine drained: bucket %q worker %q, want short/%s", back.bucket, back.worker, first.worker)
	}
}
