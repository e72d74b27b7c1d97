package indexer

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"switchyard/kv"
	"switchyard/kv/events"
	"switchyard/kv/index"
	"switchyard/kv/internal/kvtest"
	"switchyard/kv/subscribe"
)

// serve runs handler on 127.0.0.1 until the test ends and returns its base URL.
func serve(t *testing.T, handler fasthttp.RequestHandler) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &fasthttp.Server{Handler: handler}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	t.Cleanup(func() {
		if err := srv.Shutdown(); err != nil {
			t.Errorf("shutdown: %v", err)
		}
		if err := <-done; err != nil {
			t.Errorf("serve: %v", err)
		}
	})
	return "http://" + ln.Addr().String()
}

func newIndexer(t *testing.T) (*index.Index, *subscribe.Manager, string) {
	t.Helper()
	x := kvtest.NewIndex(t, 4, 1<<20)
	m, err := subscribe.NewManager(subscribe.ManagerConfig{Index: x})
	if err != nil {
		t.Fatal(err)
	}
	// Lookups are bounded by far more than the 100 ms default: under a loaded machine (the
	// race detector, other tests) a lookup can take longer, and the 503 that follows is not
	// what these tests are about.
	h, err := NewHandler(Config{Index: x, Manager: m, LookupTimeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	return x, m, serve(t, h.Serve)
}

func TestRemoteSourceMatchesLocal(t *testing.T) {
	x, _, base := newIndexer(t)
	prompt := kvtest.SeqTokens(1<<31, 3000)
	kvtest.Hold(t, x, kvtest.Register(t, x, "a", 1, 16)[0], prompt, 16, index.TierGPU)
	kvtest.Hold(t, x, kvtest.Register(t, x, "b", 2, 16)[1], prompt[:800], 16, index.TierGPU)
	r, err := NewRemoteSource(RemoteConfig{URL: base, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	var remote, local kv.Lookup
	for range 3 {
		if err := r.Lookup(context.Background(), "m", prompt, &remote); err != nil {
			t.Fatal(err)
		}
	}
	if err := x.Lookup(context.Background(), "m", prompt, &local); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(remote.Matches, local.Matches) || remote.QueryTokens != 3000 || len(remote.Matches) != 2 {
		t.Fatalf("remote %+v, local %+v", remote, local)
	}
	// The ranks travel too: b's prefix is on its rank 1.
	if remote.Ranks("a") != 1<<0 || remote.Ranks("b") != 1<<1 {
		t.Fatalf("ranks a %b, b %b", remote.Ranks("a"), remote.Ranks("b"))
	}
	if c := r.m.RemoteLookups(); c.OK != 3 {
		t.Fatalf("counts %+v", c)
	}
	t.Run("a memo keyed by source", func(t *testing.T) {
		memo := kv.NewPrefixMemo("m", prompt)
		rr := memo.Resolve(context.Background(), r)
		lr := memo.Resolve(context.Background(), x)
		if rr == lr || rr.MatchedTokens("a") != 3000 || lr.MatchedTokens("b") != 800 {
			t.Fatal("memo entries mixed up")
		}
	})
}

// TestRemoteSourceOlderIndexer: the client asks for ranks; an indexer that does not know the
// header answers version 1, read as the same matches with ranks unknown.
func TestRemoteSourceOlderIndexer(t *testing.T) {
	asked := make(chan string, 1)
	base := serve(t, func(ctx *fasthttp.RequestCtx) {
		asked <- string(ctx.Request.Header.Peek(HeaderRanks))
		ctx.SetBody(AppendAnswer(nil, &kv.Lookup{QueryTokens: 64, Matches: []kv.Match{{Worker: "a", Tokens: 32, Ranks: 1}}}, false))
	})
	r, _ := NewRemoteSource(RemoteConfig{URL: base, Timeout: 5 * time.Second})
	var l kv.Lookup
	if err := r.Lookup(context.Background(), "m", kvtest.SeqTokens(0, 64), &l); err != nil {
		t.Fatal(err)
	}
	if h := <-asked; h != "1" {
		t.Fatalf("the query's %s header: %q", HeaderRanks, h)
	}
	if l.Tokens("a") != 32 || l.Ranks("a") != 0 {
		t.Fatalf("lookup %+v: want a's 32 tokens, ranks unknown", l.Matches)
	}
}

func TestIndexerJSONProtocol(t *testing.T) {
	x, _, base := newIndexer(t)
	kvtest.Hold(t, x, kvtest.Register(t, x, "a", 1, 4)[0], []uint32{1, 2, 3, 4, 5}, 4, index.TierGPU)
	post := func(body string) (int, string) {
		resp, err := http.Post(base+PathMatch, ContentTypeJSON, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	code, body := post(`{"model":"m","token_ids":[1,2,3,4,5,6]}`)
	if code != 200 || strings.TrimSpace(body) != `{"query_tokens":6,"matches":[{"worker":"a","tokens":4,"ranks":[0]}]}` {
		t.Fatalf("%d %s", code, body)
	}
	if code, _ := post(`{"model":"m","token_ids":[-1]}`); code != 400 {
		t.Fatalf("negative token: %d", code)
	}
	big := `{"model":"m","token_ids":[` + strings.Repeat("1,", MaxQueryTokens) + `1]}`
	if code, _ := post(big); code != 413 {
		t.Fatalf("too many tokens: %d", code)
	}
}

func TestIndexerWorkerRoutes(t *testing.T) {
	x, m, base := newIndexer(t)
	do := func(method, path, body string) int {
		req, _ := http.NewRequest(method, base+path, strings.NewReader(body))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if c := do("POST", PathWorkers, `{"id":"a","model":"m","kv_events":"tcp://127.0.0.1:5557","dp_size":2}`); c != 201 {
		t.Fatalf("add: %d", c)
	}
	if c := do("POST", PathWorkers, `{"id":"b","model":"m","bogus":1}`); c != 400 {
		t.Fatalf("unknown field: %d", c)
	}
	if c := do("POST", PathWorkers, `{"id":"c","model":"m","kv_events":"udp://x"}`); c != 400 {
		t.Fatalf("bad endpoint: %d", c)
	}
	if x.Owners().Len() != 2 {
		t.Fatalf("owners %d", x.Owners().Len())
	}
	resp, err := http.Get(base + PathStatus)
	if err != nil {
		t.Fatal(err)
	}
	var st Status
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if st.Owners != 2 || len(st.Workers) != 1 || st.Workers[0].ID != "a" {
		t.Fatalf("status %+v", st)
	}
	if c := do("DELETE", PathWorkers+"/a", ""); c != 204 {
		t.Fatalf("remove: %d", c)
	}
	if c := do("DELETE", PathWorkers+"/a", ""); c != 404 {
		t.Fatalf("remove twice: %d", c)
	}
	if len(m.Status()) != 0 || x.Owners().Len() != 0 {
		t.Fatal("worker not removed")
	}
	for path, want := range map[string]int{PathHealth: 200, PathMetrics: 200, "/nope": 404} {
		resp, err := http.Get(base + path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Errorf("GET %s: %d, want %d", path, resp.StatusCode, want)
		}
	}
	if c := do("GET", PathMatch, ""); c != 405 {
		t.Fatalf("GET match: %d", c)
	}
}

func TestRemoteSourceFailures(t *testing.T) {
	prompt := kvtest.SeqTokens(0, 64)
	t.Run("a 400 is a rejected query", func(t *testing.T) {
		base := serve(t, func(ctx *fasthttp.RequestCtx) { ctx.Error("no", fasthttp.StatusBadRequest) })
		r, _ := NewRemoteSource(RemoteConfig{URL: base, Timeout: 5 * time.Second})
		var l kv.Lookup
		err := r.Lookup(context.Background(), "m", prompt, &l)
		if !errors.Is(err, kv.ErrRejected) || errors.Is(err, kv.ErrUnavailable) {
			t.Fatalf("err = %v", err)
		}
		if c := r.m.RemoteLookups(); c.Rejected != 1 {
			t.Fatalf("counts %+v", c)
		}
	})
	for _, code := range []int{fasthttp.StatusServiceUnavailable, fasthttp.StatusRequestEntityTooLarge, fasthttp.StatusNotFound} {
		t.Run("status "+fasthttp.StatusMessage(code)+" is unavailable", func(t *testing.T) {
			base := serve(t, func(ctx *fasthttp.RequestCtx) { ctx.Error("no", code) })
			r, _ := NewRemoteSource(RemoteConfig{URL: base, Timeout: 5 * time.Second})
			var l kv.Lookup
			if err := r.Lookup(context.Background(), "m", prompt, &l); !errors.Is(err, kv.ErrUnavailable) {
				t.Fatalf("err = %v", err)
			}
		})
	}
	t.Run("garbage answer is unavailable", func(t *testing.T) {
		base := serve(t, func(ctx *fasthttp.RequestCtx) { ctx.SetBodyString("SYR1\xff") })
		r, _ := NewRemoteSource(RemoteConfig{URL: base, Timeout: 5 * time.Second})
		var l kv.Lookup
		if err := r.Lookup(context.Background(), "m", prompt, &l); !errors.Is(err, kv.ErrUnavailable) {
			t.Fatalf("err = %v", err)
		}
	})
	t.Run("unreachable is unavailable", func(t *testing.T) {
		ln, _ := net.Listen("tcp", "127.0.0.1:0")
		addr := ln.Addr().String()
		ln.Close()
		r, _ := NewRemoteSource(RemoteConfig{URL: "http://" + addr, Timeout: 5 * time.Second})
		var l kv.Lookup
		if err := r.Lookup(context.Background(), "m", prompt, &l); !errors.Is(err, kv.ErrUnavailable) {
			t.Fatalf("err = %v", err)
		}
	})
	t.Run("timeout and in-flight limit are unavailable", func(t *testing.T) {
		release := make(chan struct{})
		var releaseOnce sync.Once
		releaseAll := func() { releaseOnce.Do(func() { close(release) }) }
		defer releaseAll()
		// A lookup the indexer does not answer within the timeout is unavailable.
		hung := serve(t, func(ctx *fasthttp.RequestCtx) {
			<-release
			ctx.SetBody(AppendAnswer(nil, &kv.Lookup{}, false))
		})
		r, _ := NewRemoteSource(RemoteConfig{URL: hung, Timeout: 50 * time.Millisecond, MaxInflight: 1})
		var l kv.Lookup
		if err := r.Lookup(context.Background(), "m", prompt, &l); !errors.Is(err, kv.ErrUnavailable) || errors.Is(err, errInflight) {
			t.Fatalf("timed-out lookup: %v", err)
		}
		if c := r.m.RemoteLookups(); c.Unavailable != 1 {
			t.Fatalf("counts %+v", c)
		}
		// A lookup past the in-flight limit is unavailable without a request. The timeout is
		// not what this part tests: it only has to outlast a loaded host's delay between the
		// first lookup's arrival and the second lookup (a 50 ms timeout freed the slot first).
		entered := make(chan struct{}, 1)
		base := serve(t, func(ctx *fasthttp.RequestCtx) {
			entered <- struct{}{}
			<-release
			ctx.SetBody(AppendAnswer(nil, &kv.Lookup{}, false))
		})
		r, _ = NewRemoteSource(RemoteConfig{URL: base, Timeout: time.Minute, MaxInflight: 1})
		first := make(chan error, 1)
		go func() {
			var l kv.Lookup
			first <- r.Lookup(context.Background(), "m", prompt, &l)
		}()
		<-entered // the first lookup holds the only slot
		err := r.Lookup(context.Background(), "m", prompt, &l)
		if !errors.Is(err, kv.ErrUnavailable) || !errors.Is(err, errInflight) {
			t.Fatalf("second lookup: %v", err)
		}
		releaseAll()
		if err := <-first; err != nil {
			t.Fatalf("first lookup: %v", err)
		}
		if c := r.m.RemoteLookups(); c.Unavailable != 1 {
			t.Fatalf("counts %+v", c)
		}
	})
	t.Run("an expired context is unavailable without a request", func(t *testing.T) {
		r, _ := NewRemoteSource(RemoteConfig{URL: "http://127.0.0.1:1"})
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		var l kv.Lookup
		if err := r.Lookup(ctx, "m", prompt, &l); !errors.Is(err, kv.ErrUnavailable) {
			t.Fatalf("err = %v", err)
		}
	})
	if _, err := NewRemoteSource(RemoteConfig{URL: "ftp://x"}); err == nil {
		t.Fatal("a non-http URL was accepted")
	}
}

func TestWireRoundTrip(t *testing.T) {
	tokens := []uint32{0, 1, 1 << 31, 1<<32 - 1}
	model, got, err := DecodeQuery(AppendQuery(nil, "llama-3", tokens), nil)
	if err != nil || string(model) != "llama-3" || !slices.Equal(got, tokens) {
		t.Fatalf("query: %q %v %v", model, got, err)
	}
	in := kv.Lookup{QueryTokens: 99, Matches: []kv.Match{{Worker: "a", Tokens: 16, Ranks: 1<<0 | 1<<63}, {Worker: "w-2", Tokens: 99, Ranks: 1 << 5}}}
	var out kv.Lookup
	if err := DecodeAnswer(AppendAnswer(nil, &in, true), &out, nil); err != nil || !slices.Equal(in.Matches, out.Matches) || out.QueryTokens != 99 {
		t.Fatalf("answer with ranks: %+v %v", out, err)
	}
	// Version 1 (an indexer that does not know ranks, or a query that did not ask): the
	// same matches, ranks unknown.
	if err := DecodeAnswer(AppendAnswer(nil, &in, false), &out, nil); err != nil || len(out.Matches) != 2 ||
		out.Matches[0] != (kv.Match{Worker: "a", Tokens: 16}) || out.Matches[1] != (kv.Match{Worker: "w-2", Tokens: 99}) {
		t.Fatalf("answer without ranks: %+v %v", out, err)
	}
	if err := DecodeAnswer([]byte("SYR2\x01\x01\x01a\x01"), &out, nil); !errors.Is(err, events.ErrMalformed) {
		t.Fatalf("a version 2 match without its ranks: %v", err)
	}
	for name, body := range map[string][]byte{
		"empty":          nil,
		"bad magic":      []byte("XXXX"),
		"trailing":       append(AppendQuery(nil, "m", tokens), 0),
		"short tokens":   AppendQuery(nil, "m", tokens)[:20],
		"huge count":     append([]byte("SYQ1\x01m"), 0xff, 0xff, 0xff, 0xff, 0x0f),
		"over the limit": append([]byte("SYQ1\x01m"), 0x81, 0x80, 0x40),
	} {
		if _, _, err := DecodeQuery(body, nil); !errors.Is(err, events.ErrMalformed) {
			t.Errorf("%s: err = %v", name, err)
		}
	}
}

func FuzzDecodeQuery(f *testing.F) {
	f.Add(AppendQuery(nil, "llama", []uint32{1, 2, 3}), false)
	f.Add([]byte(`{"model":"m","token_ids":[1,2,4294967295]}`), true)
	f.Add([]byte("SYQ1\x00\x00"), false)
	f.Fuzz(func(t *testing.T, body []byte, asJSON bool) {
		if asJSON {
			model, tokens, err := DecodeJSONQuery(body)
			if err == nil && (len(model) > MaxModelName || len(tokens) > MaxQueryTokens) {
				t.Fatal("limits not enforced")
			}
			return
		}
		model, tokens, err := DecodeQuery(body, nil)
		if err != nil {
			return
		}
		if again := AppendQuery(nil, string(model), tokens); !bytes.Equal(again, body) {
			t.Fatalf("re-encoding differs: %x vs %x", again, body)
		}
	})
}

func FuzzDecodeAnswer(f *testing.F) {
	f.Add(AppendAnswer(nil, &kv.Lookup{QueryTokens: 10, Matches: []kv.Match{{Worker: "a", Tokens: 3}, {Worker: "b", Tokens: 10}}}, false))
	f.Add(AppendAnswer(nil, &kv.Lookup{QueryTokens: 10, Matches: []kv.Match{{Worker: "a", Tokens: 3, Ranks: 2}, {Worker: "a", Tokens: 3, Ranks: 1}}}, true))
	f.Add([]byte("SYR1\x00\x00"))
	f.Add([]byte("SYR2\x00\x00"))
	f.Fuzz(func(t *testing.T, body []byte) {
		var l kv.Lookup
		if err := DecodeAnswer(body, &l, nil); err != nil {
			return
		}
		if !slices.IsSortedFunc(l.Matches, func(a, b kv.Match) int { return strings.Compare(a.Worker, b.Worker) }) {
			t.Fatal("matches not normalized")
		}
		for _, m := range l.Matches {
			if m.Tokens <= 0 {
				t.Fatalf("match %+v kept", m)
			}
		}
	})
}
