package actors

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/VictoriaMetrics/metrics"

	"switchyard/config"
	"switchyard/engine"
	"switchyard/load"
)

// affClock is a fake clock.
type affClock struct {
	mu sync.Mutex
	t  time.Time
}

func newAffClock() *affClock { return &affClock{t: affT0} }

func (c *affClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *affClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// newAffStore builds a store on a fake clock with a private metric set and closes it when
// the test ends.
func newAffStore(t testing.TB, opts AffinityOptions) (*AffinityStore, *affClock, *metrics.Set) {
	t.Helper()
	clk := newAffClock()
	if opts.Now == nil {
		opts.Now = clk.Now
	}
	if opts.Metrics == nil {
		opts.Metrics = metrics.NewSet()
	}
	if opts.System == nil {
		opts.System, _ = newObservedSystem(t, opts.Metrics)
	}
	s := NewAffinityStore(opts)
	t.Cleanup(s.Close)
	return s, clk, opts.Metrics
}

var affScope = engine.AffinityScope{Model: testModel, BucketID: "b", Stage: engine.StagePlain}

// metricValue returns the value of the series named exactly name in set, or -1.
func metricValue(t testing.TB, set *metrics.Set, name string) float64 {
	t.Helper()
	var buf bytes.Buffer
	set.WritePrometheus(&buf)
	for _, line := range strings.Split(buf.String(), "\n") {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			var f float64
			if _, err := fmt.Sscan(v, &f); err != nil {
				t.Fatalf("series %s: %v", name, err)
			}
			return f
		}
	}
	return -1
}

func mustLookup(t testing.TB, s *AffinityStore, sc engine.AffinityScope, key string, now time.Time) string {
	t.Helper()
	w, err := s.Lookup(sc, key, now)
	if err != nil {
		t.Fatalf("lookup %s: %v", key, err)
	}
	return w
}

func mustBind(t testing.TB, s *AffinityStore, sc engine.AffinityScope, key, expect, id string, now time.Time) string {
	t.Helper()
	w, _, err := s.Bind(sc, key, expect, id, now)
	if err != nil {
		t.Fatalf("bind %s: %v", key, err)
	}
	return w
}

func TestAffinityStoreLookupAndBind(t *testing.T) {
	s, clk, set := newAffStore(t, AffinityOptions{})
	other := engine.AffinityScope{Model: testModel, BucketID: "b", Stage: engine.StageDecode}
	now := clk.Now()
	if w := mustLookup(t, s, affScope, "k", now); w != "" {
		t.Fatalf("empty store has %q", w)
	}
	if w := mustBind(t, s, affScope, "k", "", "W1", now); w != "W1" {
		t.Fatalf("first bind = %q", w)
	}
	if w := mustBind(t, s, affScope, "k", "", "W2", now); w != "W1" {
		t.Fatalf("second first bind = %q, want the winner W1", w)
	}
	if w := mustLookup(t, s, affScope, "k", now); w != "W1" {
		t.Fatalf("lookup = %q", w)
	}
	if w := mustLookup(t, s, other, "k", now); w != "" {
		t.Fatalf("the decode scope sees the plain scope's binding %q", w)
	}
	// A zero time takes the store's clock.
	if w := mustLookup(t, s, affScope, "k", time.Time{}); w != "W1" {
		t.Fatalf("lookup at the store clock = %q", w)
	}
	labels := `{model="llama",bucket="b",stage="plain"`
	for name, want := range map[string]float64{
		metricAffinityBindings + labels + `}`:                1,
		metricAffinityLookups + labels + `,result="hit"}`:    2,
		metricAffinityLookups + labels + `,result="miss"}`:   1,
		metricAffinityBinds + labels + `,result="bound"}`:    1,
		metricAffinityBinds + labels + `,result="conflict"}`: 1,
		metricAffinityScopes:                                 2,
	} {
		if got := metricValue(t, set, name); got != want {
			t.Fatalf("%s = %v, want %v", name, got, want)
		}
	}
}

// TestAffinityStoreConcurrentFirstBindsConverge: many first binds of one key race through
// the scope actor; exactly one wins and every caller learns the same winner.
func TestAffinityStoreConcurrentFirstBindsConverge(t *testing.T) {
	s, clk, set := newAffStore(t, AffinityOptions{})
	const n = 32
	for round := range 5 {
		key := fmt.Sprintf("session-%d", round)
		start := make(chan struct{})
		got := make([]string, n)
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() {
				<-start
				w, _, err := s.Bind(affScope, key, "", fmt.Sprintf("W%d", i), clk.Now())
				if err != nil {
					t.Error(err)
				}
				got[i] = w
			})
		}
		close(start)
		wg.Wait()
		for i := range got {
			if got[i] != got[0] || got[0] == "" {
				t.Fatalf("round %d: callers disagree: %v", round, got)
			}
		}
		if w := mustLookup(t, s, affScope, key, clk.Now()); w != got[0] {
			t.Fatalf("round %d: bound %q, callers saw %q", round, w, got[0])
		}
	}
	labels := `{model="llama",bucket="b",stage="plain"`
	if b, c := metricValue(t, set, metricAffinityBinds+labels+`,result="bound"}`), metricValue(t, set, metricAffinityBinds+labels+`,result="conflict"}`); b != 5 || c != 5*(n-1) {
		t.Fatalf("bound %v conflicts %v, want 5 and %d", b, c, 5*(n-1))
	}
}

// TestAffinitySessionFirstRequestsConverge: many concurrent first requests of one session,
// each through its own session_aware instance (as several group actors or router replicas
// sharing the store would), all land on one engine; so do sticky's with a random fallback.
func TestAffinitySessionFirstRequestsConverge(t *testing.T) {
	ws := workers("w", 8, engine.StagePlain)
	kinds := []struct {
		name   string
		mk     func(seed uint64, s engine.AffinityStore) engine.Policy
		key    func(r *engine.BucketRequest, k string)
		reuse  string
		assign string
	}{
		{"session_aware", func(seed uint64, s engine.AffinityStore) engine.Policy {
			return engine.NewSessionAware(nil, nil, s, rand.New(rand.NewPCG(seed, seed)))
		}, func(r *engine.BucketRequest, k string) { r.SessionKey = k }, engine.ReasonSessionPrimary, engine.ReasonAssigned},
		{"sticky", func(seed uint64, s engine.AffinityStore) engine.Policy {
			return engine.NewSticky(nil, nil, s, engine.NewRandom(nil, nil, rand.New(rand.NewPCG(seed, seed))))
		}, func(r *engine.BucketRequest, k string) { r.RoutingKey = k }, engine.ReasonHit, engine.ReasonAssigned},
	}
	for _, kind := range kinds {
		t.Run(kind.name, func(t *testing.T) {
			s, clk, _ := newAffStore(t, AffinityOptions{})
			const n = 16
			policies := make([]engine.Policy, n)
			for i := range policies {
				policies[i] = kind.mk(uint64(i+1), s)
			}
			for round := range 8 {
				key := fmt.Sprintf("chat-%d", round)
				start := make(chan struct{})
				picks := make([]engine.Pick, n)
				var wg sync.WaitGroup
				for i := range n {
					wg.Go(func() {
						req := &engine.BucketRequest{Model: testModel, InputTokens: 10, ExpectedPeak: -1, Now: clk.Now()}
						kind.key(req, key)
						<-start
						p, err := policies[i].Pick(ws, &engine.PickRequest{BucketRequest: req, Stage: engine.StagePlain, BucketID: "b"})
						if err != nil {
							t.Error(err)
						}
						picks[i] = p
					})
				}
				close(start)
				wg.Wait()
				assigned := 0
				for i, p := range picks {
					if p.Worker != picks[0].Worker || p.Worker == nil {
						t.Fatalf("round %d: request %d went to %v, request 0 to %v", round, i, p.Worker, picks[0].Worker)
					}
					switch p.Reason {
					case kind.assign:
						assigned++
					case kind.reuse:
					default:
						t.Fatalf("round %d: reason %q", round, p.Reason)
					}
				}
				if assigned != 1 {
					t.Fatalf("round %d: %d requests created the binding, want 1", round, assigned)
				}
				if w := mustLookup(t, s, affScope, key, clk.Now()); w != picks[0].Worker.ID {
					t.Fatalf("round %d: bound to %q, served by %v", round, w, picks[0].Worker)
				}
			}
		})
	}
}

func TestAffinityStoreExpiryWithFakeClock(t *testing.T) {
	s, clk, set := newAffStore(t, AffinityOptions{IdleTimeout: 10 * time.Minute})
	mustBind(t, s, affScope, "old", "", "W1", clk.Now())
	clk.Advance(5 * time.Minute)
	mustBind(t, s, affScope, "young", "", "W2", clk.Now())
	clk.Advance(5*time.Minute - time.Nanosecond)
	if n, err := s.Sweep(clk.Now()); n != 0 || err != nil {
		t.Fatalf("sweep before the idle timeout removed %d (%v)", n, err)
	}
	clk.Advance(time.Nanosecond)
	if n, err := s.Sweep(clk.Now()); n != 1 || err != nil {
		t.Fatalf("sweep at the idle timeout removed %d (%v), want 1", n, err)
	}
	if w := mustLookup(t, s, affScope, "old", clk.Now()); w != "" {
		t.Fatalf("expired binding still answers %q", w)
	}
	// A use keeps a binding alive: young was last used at 5m, so refreshing it now moves its
	// expiry to now+10m.
	if w := mustLookup(t, s, affScope, "young", clk.Now()); w != "W2" {
		t.Fatalf("young = %q", w)
	}
	clk.Advance(10*time.Minute - time.Second)
	if w := mustLookup(t, s, affScope, "young", clk.Now()); w != "W2" {
		t.Fatalf("young expired early: %q", w)
	}

	// The application's sweeper: ticks come from a channel the test owns; the time is the
	// store's clock.
	ticks := make(chan time.Time)
	done := make(chan struct{})
	go func() {
		defer close(done)
		s.RunSweeper(context.Background(), ticks)
	}()
	clk.Advance(10 * time.Minute)
	ticks <- time.Time{}
	close(ticks)
	<-done
	labels := `{model="llama",bucket="b",stage="plain"`
	if got := metricValue(t, set, metricAffinityRemoved+labels+`,cause="expired"}`); got != 2 {
		t.Fatalf("expired = %v, want 2", got)
	}
	if got := metricValue(t, set, metricAffinityBindings+labels+`}`); got != 0 {
		t.Fatalf("bindings gauge = %v after every binding expired", got)
	}
}

// TestAffinitySweeperStopsWithContext: the sweeper sweeps on each tick while its context
// lives, returns once it is cancelled, and takes no tick after that.
func TestAffinitySweeperStopsWithContext(t *testing.T) {
	s, clk, set := newAffStore(t, AffinityOptions{IdleTimeout: time.Minute})
	mustBind(t, s, affScope, "k", "", "W1", clk.Now())
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ticks := make(chan time.Time) // unbuffered: a send returns once the sweeper took the tick
	done := make(chan struct{})
	go func() {
		defer close(done)
		s.RunSweeper(ctx, ticks)
	}()
	clk.Advance(time.Minute)
	ticks <- time.Time{}
	ticks <- time.Time{} // taken only after the first sweep ended
	expired := metricAffinityRemoved + `{model="llama",bucket="b",stage="plain",cause="expired"}`
	if got := metricValue(t, set, expired); got != 1 {
		t.Fatalf("expired = %v after a tick past the idle timeout, want 1", got)
	}
	cancel()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("RunSweeper did not return after its context was cancelled")
	}
	select {
	case ticks <- time.Time{}:
		t.Fatal("a stopped sweeper took a tick")
	default:
	}
}

// TestAffinityInvalidateWorker: removing a worker drops its bindings in every scope; the
// sessions it held are assigned afresh, the others stay.
func TestAffinityInvalidateWorker(t *testing.T) {
	s, clk, set := newAffStore(t, AffinityOptions{})
	ws := workers("w", 3, engine.StagePlain)
	wset := workerSet(t, ws)
	p := engine.NewSessionAware(nil, nil, s, rand.New(rand.NewPCG(1, 1)))
	g := engine.NewEngineGroup(testModel, engine.StagePlain, nil, p)
	home := map[string]*engine.Worker{}
	for i := range 12 {
		key := fmt.Sprintf("s%d", i)
		pick, err := g.Pick(wset.Load(), "b", affRequest(clk, key, ""))
		if err != nil {
			t.Fatal(err)
		}
		home[key] = pick.Worker
	}
	prefill := engine.AffinityScope{Model: testModel, BucketID: "b", Stage: engine.StagePrefill}
	mustBind(t, s, prefill, "s0", "", ws[1].ID, clk.Now())

	removed := wset.Remove(ws[1].ID)
	want := 1 // the prefill scope's binding
	for _, w := range home {
		if w == removed {
			want++
		}
	}
	if want == 1 {
		t.Fatal("fixture: no session landed on w2")
	}
	n, err := s.InvalidateWorker(removed.ID)
	if err != nil || n != want {
		t.Fatalf("invalidated %d (%v), want %d", n, err, want)
	}
	if w := mustLookup(t, s, prefill, "s0", clk.Now()); w != "" {
		t.Fatalf("prefill binding to the removed worker survived: %q", w)
	}
	for key, w := range home {
		pick, err := g.Pick(wset.Load(), "b", affRequest(clk, key, ""))
		if err != nil {
			t.Fatal(err)
		}
		switch {
		case w == removed && (pick.Reason != engine.ReasonAssigned || pick.Worker == removed):
			t.Fatalf("%s (was on the removed worker) got %v (%s), want a new assignment", key, pick.Worker, pick.Reason)
		case w != removed && (pick.Worker != w || pick.Reason != engine.ReasonSessionPrimary):
			t.Fatalf("%s moved from %v to %v (%s)", key, w, pick.Worker, pick.Reason)
		}
	}
	labels := `{model="llama",bucket="b",stage="plain"`
	if got := metricValue(t, set, metricAffinityRemoved+labels+`,cause="invalidated"}`); got != float64(want-1) {
		t.Fatalf("invalidated counter = %v, want %d", got, want-1)
	}
}

func TestAffinityStoreLRUBoundIsCounted(t *testing.T) {
	s, clk, set := newAffStore(t, AffinityOptions{MaxBindings: 2})
	for i, key := range []string{"a", "b", "c", "d"} {
		clk.Advance(time.Second)
		mustBind(t, s, affScope, key, "", fmt.Sprintf("W%d", i), clk.Now())
		if key == "b" {
			mustLookup(t, s, affScope, "a", clk.Now()) // a is now more recent than b
		}
	}
	// a was touched after b was bound, so c evicts b, then d evicts a.
	for key, want := range map[string]string{"a": "", "b": "", "c": "W2", "d": "W3"} {
		if got := mustLookup(t, s, affScope, key, clk.Now()); got != want {
			t.Fatalf("%s = %q, want %q", key, got, want)
		}
	}
	labels := `{model="llama",bucket="b",stage="plain"`
	if got := metricValue(t, set, metricAffinityRemoved+labels+`,cause="evicted"}`); got != 2 {
		t.Fatalf("evicted = %v, want 2", got)
	}
	if got := metricValue(t, set, metricAffinityBindings+labels+`}`); got != 2 {
		t.Fatalf("bindings = %v, want 2", got)
	}
}

// blockingHook returns an Observe hook that blocks the scope actor on a command for key
// until release is closed, signalling entered first.
func blockingHook(key string) (hook func(any), entered chan struct{}, release chan struct{}) {
	entered, release = make(chan struct{}, 1), make(chan struct{})
	hook = func(msg any) {
		if m, ok := msg.(*LookupBinding); ok && m.Key == key {
			entered <- struct{}{}
			<-release
		}
	}
	return hook, entered, release
}

// holdScope holds affScope's actor (which must be running) in a lookup of key until release
// is called (once; also at the test's end). The lookup is sent raw, without a deadline: a
// call that missed its deadline before the actor took it would be skipped, and never hold
// it. answered waits for the held lookup's answer.
func holdScope(t *testing.T, s *AffinityStore, clk *affClock, key string) (release, answered func()) {
	t.Helper()
	hook, entered, held := blockingHook(key)
	obsOf(t, s.sys).set(hook)
	release = sync.OnceFunc(func() { close(held) })
	t.Cleanup(release)
	c := newAffinityCall()
	c.lookup = LookupBinding{Key: key, Now: clk.Now(), call: c}
	s.root.Send((*s.scopes.Load())[affScope].pid, &c.lookup)
	select {
	case <-entered:
	case <-time.After(10 * time.Second):
		t.Fatal("the scope actor never took the holding lookup")
	}
	answered = func() {
		t.Helper()
		select {
		case <-c.reply:
		case <-time.After(10 * time.Second):
			t.Fatal("the holding lookup was never answered")
		}
	}
	return release, answered
}

func TestAffinityStoreFullMailboxRejectsFast(t *testing.T) {
	s, clk, set := newAffStore(t, AffinityOptions{Mailbox: 1, CallTimeout: time.Minute})
	hook, entered, release := blockingHook("block")
	obsOf(t, s.sys).set(hook)
	mustLookup(t, s, affScope, "warm-up", clk.Now()) // spawn the scope
	blocked := make(chan error, 1)
	go func() {
		_, err := s.Lookup(affScope, "block", clk.Now())
		blocked <- err
	}()
	<-entered
	// The actor is busy: queue commands without waiting until the mailbox refuses one. A
	// refusal is answered on the sending goroutine, so its reply is already there.
	h := (*s.scopes.Load())[affScope]
	var queued []*affinityCall
	refused := 0
	for range 8 {
		c := newAffinityCall()
		c.lookup = LookupBinding{Key: "q", Now: clk.Now(), call: c}
		s.root.Send(h.pid, &c.lookup)
		select {
		case <-c.reply:
			if engine.OutcomeOf(c.lookupRes.Err) != engine.OutcomeOverloaded {
				t.Fatalf("refused with %v, want overloaded", c.lookupRes.Err)
			}
			refused++
		default:
			if refused > 0 {
				t.Fatal("a command was queued after the mailbox refused one")
			}
			queued = append(queued, c)
		}
	}
	if len(queued) == 0 || refused == 0 {
		t.Fatalf("queued %d, refused %d", len(queued), refused)
	}
	// The store's own call path reports the overload as a typed error at once.
	if _, err := s.Lookup(affScope, "q", clk.Now()); engine.OutcomeOf(err) != engine.OutcomeOverloaded {
		t.Fatalf("lookup on a full mailbox: %v", err)
	}
	if got := metricValue(t, set, metricMailboxRejections+`{kind="affinity"}`); got != float64(refused+1) {
		t.Fatalf("rejections = %v, want %d", got, refused+1)
	}
	close(release)
	if err := <-blocked; err != nil {
		t.Fatal(err)
	}
	for _, c := range queued {
		select {
		case <-c.reply:
			if c.lookupRes.Err != nil {
				t.Fatal(c.lookupRes.Err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("a queued command was never answered")
		}
	}
}

func TestAffinityStoreDeadline(t *testing.T) {
	s, clk, set := newAffStore(t, AffinityOptions{CallTimeout: 250 * time.Millisecond})
	mustBind(t, s, affScope, "warm-up", "", "W1", clk.Now()) // spawns the scope
	release, answered := holdScope(t, s, clk, "block")
	timeouts := metricValue(t, set, metricAffinityTimeouts)
	if _, err := s.Lookup(affScope, "next", clk.Now()); engine.OutcomeOf(err) != engine.OutcomeTimeout {
		t.Fatalf("lookup behind a stuck actor: %v, want timeout", err)
	}
	if got := metricValue(t, set, metricAffinityTimeouts); got != timeouts+1 {
		t.Fatalf("timeouts = %v, want %v", got, timeouts+1)
	}
	release()
	answered()
	if w := mustBind(t, s, affScope, "k", "", "W1", clk.Now()); w != "W1" {
		t.Fatalf("after the actor recovered: %q", w)
	}
}

// TestAffinityDeadlineServesUnbound: a routing key and a session pinned to w3, asked for while
// their scope actor is held (as a host starved of CPU holds it), are served by the fallback
// (store_timeout) rather than failed; the pins survive, and once the actor answers again the
// keys are back on w3.
func TestAffinityDeadlineServesUnbound(t *testing.T) {
	// The deadline is the production one (a quarter of the default pick deadline would be
	// missed by the picks after the release on a loaded machine too); both held picks wait
	// it out together.
	s, clk, set := newAffStore(t, AffinityOptions{CallTimeout: time.Second})
	ws := workers("w", 3, engine.StagePlain)
	policies := []struct {
		name string
		p    engine.Policy
		req  *engine.BucketRequest
		hit  string
	}{
		{engine.PolicySticky, engine.NewSticky(nil, nil, s, engine.NewRoundRobin(nil, nil)), affRequest(clk, "", "pinned"), engine.ReasonHit},
		{engine.PolicySessionAware, engine.NewSessionAware(nil, nil, s, rand.New(rand.NewPCG(1, 1))), affRequest(clk, "pinned", ""), engine.ReasonSessionPrimary},
	}
	mustBind(t, s, affScope, "pinned", "", "w3", clk.Now())
	release, answered := holdScope(t, s, clk, "stall")
	timeouts := metricValue(t, set, metricAffinityTimeouts)
	errs := make(chan error, len(policies))
	for _, tt := range policies {
		go func() {
			got, err := tt.p.Pick(ws, &engine.PickRequest{BucketRequest: tt.req, Stage: engine.StagePlain, BucketID: "b"})
			if err != nil || got.Worker == nil || got.Reason != engine.ReasonStoreTimeout {
				err = fmt.Errorf("%s: pick behind a held scope = %+v, %v; want an engine, reason %s", tt.name, got, err, engine.ReasonStoreTimeout)
			}
			errs <- err
		}()
	}
	for range policies {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
	if t.Failed() {
		t.FailNow()
	}
	if got := metricValue(t, set, metricAffinityTimeouts); got != timeouts+float64(len(policies)) {
		t.Fatalf("timeouts = %v, want %v", got, timeouts+float64(len(policies)))
	}
	release()
	answered()
	for _, tt := range policies {
		got, err := tt.p.Pick(ws, &engine.PickRequest{BucketRequest: tt.req, Stage: engine.StagePlain, BucketID: "b"})
		if err != nil || got.Worker != ws[2] || got.Reason != tt.hit {
			t.Fatalf("%s: pick after the actor answered = %+v, %v; want w3 (%s)", tt.name, got, err, tt.hit)
		}
	}
}

func TestAffinityStorePanicRestartsTheScope(t *testing.T) {
	s, clk, set := newAffStore(t, AffinityOptions{})
	obsOf(t, s.sys).set(func(msg any) {
		if m, ok := msg.(*LookupBinding); ok && m.Key == "panic" {
			panic("test: marked command")
		}
	})
	mustBind(t, s, affScope, "k", "", "W1", clk.Now())
	_, err := s.Lookup(affScope, "panic", clk.Now())
	if !errors.Is(err, ErrPanicked) || engine.OutcomeOf(err) != engine.OutcomeInternal {
		t.Fatalf("err = %v, want internal (panicked)", err)
	}
	// The restarted actor serves on, with no bindings.
	if w := mustLookup(t, s, affScope, "k", clk.Now()); w != "" {
		t.Fatalf("binding %q survived the restart", w)
	}
	if w := mustBind(t, s, affScope, "k", "", "W2", clk.Now()); w != "W2" {
		t.Fatalf("bind after restart = %q", w)
	}
	if got := metricValue(t, set, metricActorPanics+`{kind="affinity"}`); got != 1 {
		t.Fatalf("panics = %v", got)
	}
	if got := metricValue(t, set, metricAffinityBindings+`{model="llama",bucket="b",stage="plain"}`); got != 1 {
		t.Fatalf("bindings gauge = %v, want 1 after the restart dropped the old one", got)
	}
}

func TestAffinityStoreClose(t *testing.T) {
	// The store's own series go with it; the actor families belong to the System.
	s, clk, set := newAffStore(t, AffinityOptions{System: NewSystem(SystemOptions{})})
	mustBind(t, s, affScope, "k", "", "W1", clk.Now())
	s.Close()
	s.Close()
	for _, err := range []error{
		func() error { _, err := s.Lookup(affScope, "k", clk.Now()); return err }(),
		func() error { _, _, err := s.Bind(affScope, "k", "", "W1", clk.Now()); return err }(),
		func() error {
			_, err := s.Lookup(engine.AffinityScope{Model: "new", BucketID: "x"}, "k", clk.Now())
			return err
		}(),
	} {
		if !errors.Is(err, ErrAffinityClosed) {
			t.Fatalf("after Close: %v", err)
		}
	}
	if names := set.ListMetricNames(); len(names) != 0 {
		t.Fatalf("Close left metrics registered: %v", names)
	}
}

func affRequest(clk *affClock, session, routing string) *engine.BucketRequest {
	return &engine.BucketRequest{Model: testModel, InputTokens: 10, ExpectedPeak: -1, Now: clk.Now(),
		SessionKey: session, RoutingKey: routing}
}

// affConfig is a model with two PD buckets, each with a sticky prefill group and a
// session_aware decode group; the short bucket's decode admission caps in-flight requests at
// one, so a rejected decode binding moves the request to the long bucket.
func affConfig(prefill, decode []string, longPrefill, longDecode []string) *config.Config {
	one := int64(1)
	short, long := int64(4096), int64(131072)
	group := func(ids []string, typ string, adm config.Admission) *config.Group {
		return &config.Group{WorkerIDs: &ids, Policy: &config.Policy{Type: typ, Admission: adm}}
	}
	return &config.Config{Models: map[string]config.Model{testModel: {Buckets: []config.Bucket{
		{ID: "short", Rank: 10, Limits: config.Limits{Max: &short}, Groups: config.Groups{PD: &config.PDGroups{
			Prefill: group(prefill, config.PolicySticky, config.Admission{}),
			Decode:  group(decode, config.PolicySessionAware, config.Admission{MaxInflightRequests: &one}),
		}}},
		{ID: "long", Rank: 20, Limits: config.Limits{Max: &long}, Groups: config.Groups{PD: &config.PDGroups{
			Prefill: group(longPrefill, config.PolicySticky, config.Admission{}),
			Decode:  group(longDecode, config.PolicySessionAware, config.Admission{}),
		}}},
	}}}}
}

func ids(ws []*engine.Worker) []string {
	out := make([]string, len(ws))
	for i, w := range ws {
		out[i] = w.ID
	}
	return out
}

// TestAffinityThroughSelector runs both affinity policies inside their group actors, calling
// the store from there: a 10-turn session keeps its engines; when its decode binding is
// rejected the request moves to the next bucket and the binding stays.
func TestAffinityThroughSelector(t *testing.T) {
	sp, sd := workers("sp", 3, engine.StagePrefill), workers("sd", 3, engine.StageDecode)
	lp, ld := workers("lp", 2, engine.StagePrefill), workers("ld", 2, engine.StageDecode)
	wset := workerSet(t, sp, sd, lp, ld)
	store, clk, _ := newAffStore(t, AffinityOptions{})
	rs, err := engine.BuildResolvers(affConfig(ids(sp), ids(sd), ids(lp), ids(ld)), engine.Deps{Affinity: store, Seed: 7})
	if err != nil {
		t.Fatal(err)
	}
	sel := newAffSelector(t, rs, wset)
	resolver := rs[testModel]

	var first engine.BucketPick
	for turn := range 10 {
		req := affRequest(clk, "chat-1", "tenant-a")
		req.InputTokens = int64(100 * (turn + 1))
		pick, err := sel.Select(resolver, req)
		if err != nil {
			t.Fatalf("turn %d: %v", turn, err)
		}
		if turn == 0 {
			first = pick
			if pick.BucketID != "short" || pick.Prefill.Reason != engine.ReasonAssigned || pick.Decode.Reason != engine.ReasonAssigned {
				t.Fatalf("turn 0: %+v", pick)
			}
			continue
		}
		if pick.BucketID != "short" || pick.Prefill.Worker != first.Prefill.Worker || pick.Decode.Worker != first.Decode.Worker ||
			pick.Prefill.Reason != engine.ReasonHit || pick.Decode.Reason != engine.ReasonSessionPrimary {
			t.Fatalf("turn %d: %+v, want the engines of turn 0 reused", turn, pick)
		}
	}

	// The session's decode engine reaches its in-flight cap: the short bucket rejects the
	// bound engine (no rebinding), and the request is served by the long bucket.
	tracker := load.NewTracker()
	guard := tracker.Acquire(first.Decode.Worker.Counters, clk.Now())
	pick, err := sel.Select(resolver, affRequest(clk, "chat-1", "tenant-a"))
	if err != nil || pick.BucketID != "long" {
		t.Fatalf("with the bound decode engine full: %+v, %v; want the long bucket", pick, err)
	}
	decodeScope := engine.AffinityScope{Model: testModel, BucketID: "short", Stage: engine.StageDecode}
	if w := mustLookup(t, store, decodeScope, "chat-1", clk.Now()); w != first.Decode.Worker.ID {
		t.Fatalf("short decode binding = %q after the rejection, want %s kept", w, first.Decode.Worker.ID)
	}
	prefillScope := engine.AffinityScope{Model: testModel, BucketID: "short", Stage: engine.StagePrefill}
	if w := mustLookup(t, store, prefillScope, "tenant-a", clk.Now()); w != first.Prefill.Worker.ID {
		t.Fatalf("short prefill binding = %q after decode failed, want %s kept", w, first.Prefill.Worker.ID)
	}
	guard.Release()
	pick, err = sel.Select(resolver, affRequest(clk, "chat-1", "tenant-a"))
	if err != nil || pick.BucketID != "short" || pick.Decode.Worker != first.Decode.Worker {
		t.Fatalf("after the engine drained: %+v, %v", pick, err)
	}
}

// newAffSelector hosts resolvers on actors and closes the selector when the test ends.
func newAffSelector(t testing.TB, rs map[string]*engine.BucketResolver, wset *engine.WorkerSet) *Selector {
	t.Helper()
	sel, err := NewSelector(rs, wset, config.Actors{}, SelectorOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sel.Close)
	return sel
}
