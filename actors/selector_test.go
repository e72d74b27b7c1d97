package actors

import (
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"switchyard/config"
	"switchyard/engine"
)

func TestPickEnginesPlainRoundTrip(t *testing.T) {
	ws := workers("W", 3, engine.StagePlain)
	b := plainBucket("short", 4096, engine.NewRoundRobin(nil, nil), nil)
	s := newTestSelector(t, workerSet(t, ws), config.Actors{}, nil, b)

	var got []string
	for range 6 {
		p, err := s.PickEngines(b, request(100))
		if err != nil {
			t.Fatal(err)
		}
		if p.IsPD() || p.BucketID != "short" || p.Plain.Reason != engine.ReasonRoundRobin {
			t.Fatalf("pick = %+v, want a plain round-robin pick of bucket short", p)
		}
		got = append(got, p.Plain.Worker.ID)
	}
	if want := "W1 W2 W3 W1 W2 W3"; strings.Join(got, " ") != want {
		t.Errorf("picks = %v, want %s (one cursor owned by the group actor)", got, want)
	}
}

func TestPickEnginesPDSameBucket(t *testing.T) {
	ps := workers("P", 2, engine.StagePrefill)
	ds := workers("D", 2, engine.StageDecode)
	short := pdBucket("short", 4096, engine.NewRoundRobin(nil, nil), engine.NewRoundRobin(nil, nil), []string{"P1"}, []string{"D2"})
	long := pdBucket("long", engine.Unbounded, engine.NewRoundRobin(nil, nil), engine.NewRoundRobin(nil, nil), []string{"P2"}, []string{"D1"})
	s := newTestSelector(t, workerSet(t, ps, ds), config.Actors{}, nil, short, long)

	tests := []struct {
		name         string
		bucket       *engine.Bucket
		wantP, wantD string
	}{
		{"short", short, "P1", "D2"},
		{"long", long, "P2", "D1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := s.PickEngines(tt.bucket, request(100))
			if err != nil {
				t.Fatal(err)
			}
			if !p.IsPD() || p.BucketID != tt.name || p.Prefill.Worker.ID != tt.wantP || p.Decode.Worker.ID != tt.wantD {
				t.Errorf("pick = bucket %s P %v D %v, want bucket %s P %s D %s", p.BucketID, p.Prefill.Worker, p.Decode.Worker, tt.name, tt.wantP, tt.wantD)
			}
			if p.Plain.Worker != nil {
				t.Errorf("PD pick has a plain engine %v", p.Plain.Worker)
			}
		})
	}
}

func TestSelectDecodeFailureDiscardsPrefillAndAdvances(t *testing.T) {
	ps := workers("P", 2, engine.StagePrefill)
	ds := workers("D", 1, engine.StageDecode)
	firstPrefill := newTestPolicy()
	// The first bucket's decode group has no members: its prefill pick succeeds, then the
	// decode stage fails with NoCandidates.
	first := pdBucket("first", 4096, firstPrefill, engine.NewRoundRobin(nil, nil), []string{"P1"}, []string{})
	second := pdBucket("second", 8192, engine.NewRoundRobin(nil, nil), engine.NewRoundRobin(nil, nil), []string{"P2"}, []string{"D1"})
	s := newTestSelector(t, workerSet(t, ps, ds), config.Actors{}, nil, first, second)

	p, err := s.PickEngines(first, request(100))
	if !errors.Is(err, engine.ErrNoCandidates) {
		t.Fatalf("PickEngines(first) error = %v, want NoCandidates", err)
	}
	if pe := pickErrOf(t, err); pe.Stage != engine.StageDecode || pe.BucketID != "first" {
		t.Errorf("failure stage/bucket = %s/%s, want decode/first", pe.Stage, pe.BucketID)
	}
	if p != (engine.BucketPick{}) {
		t.Errorf("failed pick = %+v, want zero (the prefill pick is discarded)", p)
	}
	if n := firstPrefill.calls.Load(); n != 1 {
		t.Errorf("first prefill policy called %d times, want 1", n)
	}

	res := engine.NewBucketResolver(testModel, []*engine.Bucket{first, second})
	p, err = s.Select(res, request(100))
	if err != nil {
		t.Fatal(err)
	}
	if p.BucketID != "second" || p.Prefill.Worker.ID != "P2" || p.Decode.Worker.ID != "D1" {
		t.Errorf("Select = bucket %s P %v D %v, want second P2 D1", p.BucketID, p.Prefill.Worker, p.Decode.Worker)
	}
	if n := firstPrefill.calls.Load(); n != 2 {
		t.Errorf("first prefill policy called %d times, want 2 (tried again by Select)", n)
	}
}

func TestSelectOutcomes(t *testing.T) {
	ws := workers("W", 2, engine.StagePlain)
	empty := plainBucket("empty", 1000, engine.NewRoundRobin(nil, nil), []string{})
	full := plainBucket("full", 2000, engine.NewRoundRobin(nil, nil), []string{"W1"})
	s := newTestSelector(t, workerSet(t, ws), config.Actors{}, nil, empty, full)
	res := engine.NewBucketResolver(testModel, []*engine.Bucket{empty, full})

	tests := []struct {
		name       string
		req        *engine.BucketRequest
		wantBucket string
		wantErr    error
	}{
		{name: "advances past an empty group", req: request(10), wantBucket: "full"},
		{name: "only the second bucket fits", req: request(1500), wantBucket: "full"},
		{name: "no bucket fits", req: request(5000), wantErr: engine.ErrNoMatchingBucket},
		{name: "peak below input", req: &engine.BucketRequest{Model: testModel, InputTokens: 10, ExpectedPeak: 5}, wantErr: engine.ErrInvalidSignal},
		{name: "wrong model stops the loop", req: &engine.BucketRequest{Model: "other", InputTokens: 10, ExpectedPeak: -1}, wantErr: engine.ErrInvalidSignal},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := s.Select(res, tt.req)
			if tt.wantErr != nil {
				if !errors.Is(err, tt.wantErr) {
					t.Fatalf("Select error = %v, want %v", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if p.BucketID != tt.wantBucket || p.Plain.Worker.ID != "W1" {
				t.Errorf("Select = %s/%v, want %s/W1", p.BucketID, p.Plain.Worker, tt.wantBucket)
			}
		})
	}
}

func TestGroupMailboxOverflowIsOverloaded(t *testing.T) {
	ws := workers("W", 2, engine.StagePlain)
	pol := newTestPolicy()
	b := plainBucket("short", 4096, pol, nil)
	s := newTestSelector(t, workerSet(t, ws), config.Actors{PickTimeout: time.Minute, Mailbox: config.Mailbox{Bucket: 8, Group: 1}}, nil, b)

	blocked := startPick(t, s, b, requestFor(10, markBlock, "W1"))
	<-pol.entered // the group actor is inside the policy
	// Sent in order from this goroutine: the bucket actor forwards queued before overflow,
	// which fills the group's one-slot mailbox, then overflow, which it cannot take.
	queued := startPick(t, s, b, requestFor(10, "", "W2"))
	overflow := startPick(t, s, b, requestFor(10, "", "W2"))

	_, err := overflow()
	if !errors.Is(err, engine.ErrOverloaded) {
		t.Fatalf("overflow error = %v, want Overloaded", err)
	}
	if pe := pickErrOf(t, err); pe.BucketID != "short" || pe.Stage != engine.StagePlain || pe.Advances() {
		t.Errorf("overflow error = %+v, want a non-advancing plain failure of bucket short", pe)
	}
	if got := s.Counters().Rejected(KindGroup); got != 1 {
		t.Errorf("Rejected(group) = %d, want 1", got)
	}
	if got := s.Counters().Rejected(KindBucket); got != 0 {
		t.Errorf("Rejected(bucket) = %d, want 0", got)
	}

	close(pol.release)
	for name, wait := range map[string]func() (engine.BucketPick, error){"blocked": blocked, "queued": queued} {
		p, err := wait()
		if err != nil {
			t.Fatalf("%s pick: %v", name, err)
		}
		if p.Plain.Worker == nil {
			t.Fatalf("%s pick has no engine", name)
		}
	}
}

func TestBucketMailboxOverflowIsOverloaded(t *testing.T) {
	ws := workers("W", 1, engine.StagePlain)
	pol := newTestPolicy()
	b := plainBucket("short", 4096, pol, nil)
	s := newTestSelector(t, workerSet(t, ws), config.Actors{PickTimeout: time.Minute, Mailbox: config.Mailbox{Bucket: 1, Group: 1}}, nil, b)
	bh := s.buckets[b]

	// Suspend the bucket actor's mailbox (as Proto.Actor does while restarting an actor), so
	// the bucket's own queue fills deterministically.
	mb := bh.mb.Load()
	mb.PostSystemMessage(suspendMailbox())
	queued := startPick(t, s, b, request(10))
	_, err := s.PickEngines(b, request(10))
	if !errors.Is(err, engine.ErrOverloaded) {
		t.Fatalf("error = %v, want Overloaded", err)
	}
	if pe := pickErrOf(t, err); pe.BucketID != "short" {
		t.Errorf("bucket = %q, want short", pe.BucketID)
	}
	if got := s.Counters().Rejected(KindBucket); got != 1 {
		t.Errorf("Rejected(bucket) = %d, want 1", got)
	}
	mb.PostSystemMessage(resumeMailbox())
	if _, err := queued(); err != nil {
		t.Fatalf("queued pick after resume: %v", err)
	}
}

func TestPickTimeoutAndLateReply(t *testing.T) {
	ws := workers("W", 3, engine.StagePlain)
	pol := newTestPolicy()
	b := plainBucket("short", 4096, pol, nil)
	s := newTestSelector(t, workerSet(t, ws), config.Actors{PickTimeout: 20 * time.Millisecond}, nil, b)

	blockPick(t, s, b, pol, func() *engine.BucketRequest { return requestFor(10, markBlock, "W1") })
	// A second pick queued behind the blocked one also times out; its caller abandons it,
	// so the group actor skips it without calling the policy.
	if _, err := s.PickEngines(b, requestFor(10, "", "W3")); !errors.Is(err, engine.ErrTimeout) {
		t.Fatalf("queued pick error = %v, want Timeout", err)
	}
	close(pol.release) // the blocked pick now replies into its abandoned call

	// Later picks get their own results, never the late reply (W1).
	for _, id := range []string{"W2", "W3", "W2"} {
		p, err := s.PickEngines(b, requestFor(10, "", id))
		if err != nil {
			t.Fatal(err)
		}
		if p.Plain.Worker.ID != id {
			t.Fatalf("pick = %s, want %s (a late reply leaked into a reused call)", p.Plain.Worker.ID, id)
		}
	}
	if n := pol.calls.Load(); n != 4 {
		t.Errorf("policy calls = %d, want 4 (the abandoned queued pick is skipped)", n)
	}
}

func TestPolicyPanicFailsOnlyItsRequest(t *testing.T) {
	ws := workers("W", 2, engine.StagePrefill)
	ds := workers("D", 1, engine.StageDecode)
	var logs syncBuffer
	logger := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
	pol := newTestPolicy()
	b := pdBucket("pd", 4096, pol, engine.NewRoundRobin(nil, nil), nil, nil)
	s := newTestSelector(t, workerSet(t, ws, ds), config.Actors{}, logger, b)

	// More panics than Proto.Actor's default strategy tolerates (10 in 10 s): the actor must
	// still be restarted every time.
	const panics = 12
	for i := range panics {
		_, err := s.PickEngines(b, requestFor(10, markPanic, ""))
		if !errors.Is(err, engine.ErrInternal) || !errors.Is(err, ErrPanicked) {
			t.Fatalf("panic %d: error = %v, want Internal wrapping ErrPanicked", i, err)
		}
		if pe := pickErrOf(t, err); pe.Stage != engine.StagePrefill || pe.BucketID != "pd" || pe.Advances() {
			t.Fatalf("panic %d: error = %+v, want a non-advancing prefill failure of bucket pd", i, pe)
		}
		p, err := s.PickEngines(b, requestFor(10, "", "W2"))
		if err != nil {
			t.Fatalf("pick after panic %d: %v", i, err)
		}
		if p.Prefill.Worker.ID != "W2" || p.Decode.Worker.ID != "D1" {
			t.Fatalf("pick after panic %d = P %v D %v, want W2 D1", i, p.Prefill.Worker, p.Decode.Worker)
		}
	}
	if got := s.Counters().Panics(KindGroup); got != panics {
		t.Errorf("Panics(group) = %d, want %d", got, panics)
	}
	out := logs.String()
	if !strings.Contains(out, "actor panicked") || !strings.Contains(out, "test policy: marked request") {
		t.Errorf("log lacks the panic record:\n%s", out)
	}
	if !strings.Contains(out, "lib=protoactor") {
		t.Errorf("Proto.Actor's own logging is not routed to the injected logger:\n%s", out)
	}
}

func TestGroupActorSeesHealthChanges(t *testing.T) {
	ws := workers("W", 3, engine.StagePlain)
	set := workerSet(t, ws)
	b := plainBucket("short", 4096, engine.NewRoundRobin(nil, nil), nil)
	s := newTestSelector(t, set, config.Actors{}, nil, b)

	pickIDs := func(n int) map[string]int {
		seen := map[string]int{}
		for range n {
			p, err := s.PickEngines(b, request(10))
			if err != nil {
				t.Fatal(err)
			}
			seen[p.Plain.Worker.ID]++
		}
		return seen
	}
	if got := pickIDs(6); len(got) != 3 {
		t.Fatalf("picks = %v, want all three workers", got)
	}
	set.SetHealthy("W2", false)
	if got := pickIDs(6); got["W2"] != 0 || got["W1"] != 3 || got["W3"] != 3 {
		t.Fatalf("picks after W2 unhealthy = %v, want W1 and W3 only", got)
	}
	set.SetHealthy("W1", false)
	set.SetHealthy("W3", false)
	set.SetHealthy("W2", true)
	if got := pickIDs(3); got["W2"] != 3 {
		t.Fatalf("picks = %v, want W2 only", got)
	}
	set.SetHealthy("W2", false)
	if _, err := s.PickEngines(b, request(10)); !errors.Is(err, engine.ErrNoCandidates) {
		t.Fatalf("error = %v, want NoCandidates with every worker unhealthy", err)
	}
}

func TestConcurrentPicks(t *testing.T) {
	ps := workers("P", 4, engine.StagePrefill)
	ds := workers("D", 4, engine.StageDecode)
	b := pdBucket("pd", 4096, engine.NewRoundRobin(nil, nil), engine.NewRoundRobin(nil, nil), nil, nil)
	s := newTestSelector(t, workerSet(t, ps, ds), config.Actors{Mailbox: config.Mailbox{Bucket: 4096, Group: 4096}}, nil, b)
	res := engine.NewBucketResolver(testModel, []*engine.Bucket{b})

	const goroutines, each = 8, 200
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs []error
	)
	for range goroutines {
		wg.Go(func() {
			for range each {
				p, err := s.Select(res, request(10))
				if err == nil && (p.Prefill.Worker == nil || p.Decode.Worker == nil) {
					err = errors.New("incomplete PD pick")
				}
				if err != nil {
					mu.Lock()
					errs = append(errs, err)
					mu.Unlock()
					return
				}
			}
		})
	}
	wg.Wait()
	if len(errs) > 0 {
		t.Fatalf("%d failed picks, first: %v", len(errs), errs[0])
	}
}

func TestNewSelectorRefusesSharedGroup(t *testing.T) {
	ws := workers("W", 1, engine.StagePlain)
	g := engine.NewEngineGroup(testModel, engine.StagePlain, nil, engine.NewRoundRobin(nil, nil))
	a := &engine.Bucket{ID: "a", MaxInput: 10, MaxContext: engine.Unbounded, Plain: g}
	b := &engine.Bucket{ID: "b", MaxInput: 20, MaxContext: engine.Unbounded, Plain: g}
	if _, err := NewSelector(resolvers(a, b), workerSet(t, ws), config.Actors{}, SelectorOptions{}); err == nil {
		t.Fatal("NewSelector accepted a group shared by two buckets")
	}
}

func TestPickEnginesForeignAndMisconfiguredBuckets(t *testing.T) {
	ws := workers("W", 1, engine.StagePlain)
	noGroups := &engine.Bucket{ID: "none", MaxInput: 10, MaxContext: engine.Unbounded}
	s := newTestSelector(t, workerSet(t, ws), config.Actors{}, nil, noGroups)

	tests := []struct {
		name   string
		bucket *engine.Bucket
	}{
		{"not hosted", plainBucket("foreign", 10, engine.NewRoundRobin(nil, nil), nil)},
		{"no groups", noGroups},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := s.PickEngines(tt.bucket, request(1)); !errors.Is(err, engine.ErrInvalidConfiguration) {
				t.Fatalf("error = %v, want InvalidConfiguration", err)
			}
		})
	}
}

func TestCloseStopsActors(t *testing.T) {
	ws := workers("W", 1, engine.StagePlain)
	b := plainBucket("short", 4096, engine.NewRoundRobin(nil, nil), nil)
	s, err := NewSelector(resolvers(b), workerSet(t, ws), config.Actors{}, SelectorOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.PickEngines(b, request(1)); err != nil {
		t.Fatal(err)
	}
	bucketMB, groupMB := s.buckets[b].mb.Load(), s.buckets[b].plain.mb.Load()
	s.Close()
	s.Close() // idempotent
	if !bucketMB.closed.Load() || !groupMB.closed.Load() {
		t.Error("Close returned before every actor stopped")
	}
	if _, err := s.PickEngines(b, request(1)); !errors.Is(err, ErrClosed) || !errors.Is(err, engine.ErrInternal) {
		t.Fatalf("error after Close = %v, want Internal wrapping ErrClosed", err)
	}
	// A message reaching a stopped actor is answered at once, not left to its deadline.
	c := s.calls.Get().(*pickCall)
	c.arm(time.Minute)
	s.root.Send(s.buckets[b].pid, &c.engines)
	if _, err := s.await(s.buckets[b], c); !errors.Is(err, ErrStopped) {
		t.Fatalf("error of a send to a stopped actor = %v, want ErrStopped", err)
	}
}

func TestBucketActorPanicRestartsItAndItsGroups(t *testing.T) {
	ps := workers("P", 2, engine.StagePrefill)
	ds := workers("D", 2, engine.StageDecode)
	pol := newTestPolicy()
	b := pdBucket("pd", 4096, pol, engine.NewRoundRobin(nil, nil), nil, nil)
	s := newTestSelector(t, workerSet(t, ps, ds), config.Actors{PickTimeout: time.Minute}, nil, b)
	bh := s.buckets[b]
	obsOf(t, s.sys).set(func(msg any) {
		if m, ok := msg.(*PickEngines); ok && m.Request.SessionKey == markPanic {
			panic("test: bucket actor failure")
		}
	})
	if _, err := s.PickEngines(b, request(10)); err != nil {
		t.Fatal(err)
	}
	oldPrefill := bh.prefill.mb.Load() // spawned when the bucket actor started

	for i := range 3 {
		_, err := s.PickEngines(b, requestFor(10, markPanic, ""))
		if !errors.Is(err, ErrPanicked) || !errors.Is(err, engine.ErrInternal) {
			t.Fatalf("panic %d: error = %v, want Internal wrapping ErrPanicked", i, err)
		}
		// The restart stopped the group actors and spawned new ones; picks go on.
		p, err := s.PickEngines(b, requestFor(10, "", "P2"))
		if err != nil {
			t.Fatalf("pick after bucket panic %d: %v", i, err)
		}
		if p.Prefill.Worker == nil || p.Prefill.Worker.ID != "P2" || p.Decode.Worker == nil || p.BucketID != "pd" {
			t.Fatalf("pick after bucket panic %d = %+v", i, p)
		}
	}
	if got := s.Counters().Panics(KindBucket); got != 3 {
		t.Errorf("Panics(bucket) = %d, want 3", got)
	}
	if !oldPrefill.closed.Load() || bh.prefill.mb.Load() == oldPrefill {
		t.Error("the bucket restart did not replace its group actors")
	}
}

// blockPick sends the blocking pick req makes to b until one times out while the policy
// holds the group actor (bounded). On a loaded machine the deadline may pass before the
// group actor even sees the pick, which it then skips as abandoned: such picks are sent again.
func blockPick(t *testing.T, s *Selector, b *engine.Bucket, pol *testPolicy, req func() *engine.BucketRequest) {
	t.Helper()
	for range 50 {
		start := time.Now()
		_, err := s.PickEngines(b, req())
		if !errors.Is(err, engine.ErrTimeout) {
			t.Fatalf("error = %v, want Timeout", err)
		}
		if pe := pickErrOf(t, err); pe.BucketID != b.ID || pe.Advances() {
			t.Errorf("timeout error = %+v, want a non-advancing failure of bucket %s", pe, b.ID)
		}
		if d := time.Since(start); d > 5*time.Second {
			t.Errorf("timeout took %v", d)
		}
		wait := time.NewTimer(200 * time.Millisecond)
		select {
		case <-pol.entered:
			wait.Stop()
			return
		case <-wait.C:
		}
	}
	t.Fatal("no blocking pick reached the policy in 50 attempts")
}
