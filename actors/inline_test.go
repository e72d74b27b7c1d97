package actors

import (
	"errors"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"switchyard/config"
	"switchyard/engine"
)

// bucketMessages counts the PickEngines commands s's bucket actors receive and, for each
// one, sends its request's routing key on the returned channel (when there is room).
func bucketMessages(t *testing.T, s *Selector) (*atomic.Int64, <-chan string) {
	t.Helper()
	var n atomic.Int64
	keys := make(chan string, 16)
	obsOf(t, s.sys).set(func(msg any) {
		if m, ok := msg.(*PickEngines); ok {
			n.Add(1)
			select {
			case keys <- m.Request.RoutingKey:
			default:
			}
		}
	})
	return &n, keys
}

func TestSelectIdleBucketPicksInCaller(t *testing.T) {
	ws := workers("W", 2, engine.StagePlain)
	ps := workers("P", 2, engine.StagePrefill)
	ds := workers("D", 2, engine.StageDecode)
	plain := plainBucket("plain", 4096, engine.NewRoundRobin(nil, nil), nil)
	pd := pdBucket("pd", engine.Unbounded, engine.NewRoundRobin(nil, nil), engine.NewRoundRobin(nil, nil), nil, nil)
	s := newTestSelector(t, workerSet(t, ws, ps, ds), config.Actors{}, nil, plain, pd)
	msgs, _ := bucketMessages(t, s)
	plainRes := engine.NewBucketResolver(testModel, []*engine.Bucket{plain})
	pdRes := engine.NewBucketResolver(testModel, []*engine.Bucket{pd})

	var got []string
	for range 4 {
		p, err := s.Select(plainRes, request(10))
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, p.Plain.Worker.ID)
		p, err = s.Select(pdRes, request(10))
		if err != nil {
			t.Fatal(err)
		}
		if !p.IsPD() || p.BucketID != "pd" {
			t.Fatalf("PD pick = %+v", p)
		}
		got = append(got, p.Prefill.Worker.ID+"+"+p.Decode.Worker.ID)
	}
	if want := "W1 P1+D1 W2 P2+D2 W1 P1+D1 W2 P2+D2"; strings.Join(got, " ") != want {
		t.Errorf("picks = %v, want %s (the groups' own cursors)", got, want)
	}
	if n := msgs.Load(); n != 0 {
		t.Errorf("bucket actors received %d picks, want 0: an idle bucket's selection is made in the caller", n)
	}
	// PickEngines is still the round trip through the actors, on the same cursors.
	p, err := s.PickEngines(plain, request(10))
	if err != nil {
		t.Fatal(err)
	}
	if p.Plain.Worker.ID != "W1" || msgs.Load() != 1 {
		t.Errorf("PickEngines = %s with %d bucket messages, want W1 with 1", p.Plain.Worker.ID, msgs.Load())
	}
}

func TestSelectWaitsBehindABusyGroup(t *testing.T) {
	ws := workers("W", 2, engine.StagePlain)
	pol := newTestPolicy()
	b := plainBucket("short", 4096, pol, nil)
	s := newTestSelector(t, workerSet(t, ws), config.Actors{PickTimeout: time.Minute}, nil, b)
	res := engine.NewBucketResolver(testModel, []*engine.Bucket{b})
	msgs, keys := bucketMessages(t, s)

	blocked := startPick(t, s, b, requestFor(10, markBlock, "W1"))
	if k := <-keys; k != "W1" {
		t.Fatalf("first bucket message for %q, want W1", k)
	}
	<-pol.entered // the group actor holds the group, inside the policy
	done := make(chan engine.BucketPick, 1)
	go func() {
		p, err := s.Select(res, requestFor(10, "", "W2"))
		if err != nil {
			t.Error(err)
		}
		done <- p
	}()
	// The group is in use: the selection goes through the actors and queues behind it.
	if k := <-keys; k != "W2" {
		t.Fatalf("second bucket message for %q, want W2", k)
	}
	close(pol.release)
	if p, err := blocked(); err != nil || p.Plain.Worker.ID != "W1" {
		t.Fatalf("blocked pick = %v, %v; want W1", p.Plain.Worker, err)
	}
	if p := <-done; p.Plain.Worker == nil || p.Plain.Worker.ID != "W2" {
		t.Fatalf("Select behind the busy group = %v, want W2", p.Plain.Worker)
	}
	if n := msgs.Load(); n != 2 {
		t.Errorf("bucket messages = %d, want 2", n)
	}
}

func TestGroupActorWaitsForASelectionInCaller(t *testing.T) {
	ws := workers("W", 2, engine.StagePlain)
	pol := newTestPolicy()
	b := plainBucket("short", 4096, pol, nil)
	s := newTestSelector(t, workerSet(t, ws), config.Actors{PickTimeout: time.Minute}, nil, b)
	res := engine.NewBucketResolver(testModel, []*engine.Bucket{b})
	msgs, keys := bucketMessages(t, s)

	done := make(chan engine.BucketPick, 1)
	go func() {
		p, err := s.Select(res, requestFor(10, markBlock, "W1"))
		if err != nil {
			t.Error(err)
		}
		done <- p
	}()
	<-pol.entered // the caller holds the group, inside the policy
	if n := msgs.Load(); n != 0 {
		t.Fatalf("bucket messages = %d, want 0 (the selection is the caller's)", n)
	}
	// A pick through the actors reaches the bucket actor; its group actor waits for the
	// caller's selection to end before it uses the group.
	queued := startPick(t, s, b, requestFor(10, "", "W2"))
	if k := <-keys; k != "W2" {
		t.Fatalf("bucket message for %q, want W2", k)
	}
	close(pol.release)
	if p := <-done; p.Plain.Worker == nil || p.Plain.Worker.ID != "W1" {
		t.Fatalf("Select = %v, want W1", p.Plain.Worker)
	}
	if p, err := queued(); err != nil || p.Plain.Worker.ID != "W2" {
		t.Fatalf("queued pick = %v, %v; want W2", p.Plain.Worker, err)
	}
	if n := pol.calls.Load(); n != 2 {
		t.Errorf("policy calls = %d, want 2", n)
	}
}

func TestSelectPolicyPanicInCaller(t *testing.T) {
	ws := workers("W", 2, engine.StagePrefill)
	ds := workers("D", 1, engine.StageDecode)
	var logs syncBuffer
	logger := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
	pol := newTestPolicy()
	b := pdBucket("pd", 4096, pol, engine.NewRoundRobin(nil, nil), nil, nil)
	s := newTestSelector(t, workerSet(t, ws, ds), config.Actors{}, logger, b)
	res := engine.NewBucketResolver(testModel, []*engine.Bucket{b})
	msgs, _ := bucketMessages(t, s)

	const panics = 3
	for i := range panics {
		_, err := s.Select(res, requestFor(10, markPanic, ""))
		if !errors.Is(err, engine.ErrInternal) || !errors.Is(err, ErrPanicked) {
			t.Fatalf("panic %d: error = %v, want Internal wrapping ErrPanicked", i, err)
		}
		if pe := pickErrOf(t, err); pe.Stage != engine.StagePrefill || pe.BucketID != "pd" || pe.Advances() {
			t.Fatalf("panic %d: error = %+v, want a non-advancing prefill failure of bucket pd", i, pe)
		}
		// The group was given back: the next selection is made, in the caller again.
		p, err := s.Select(res, requestFor(10, "", "W2"))
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
	if n := msgs.Load(); n != 0 {
		t.Errorf("bucket messages = %d, want 0", n)
	}
	if out := logs.String(); !strings.Contains(out, "policy panicked in a request's own selection") || !strings.Contains(out, "test policy: marked request") {
		t.Errorf("log lacks the panic record:\n%s", out)
	}
}

// TestConcurrentSelectsShareOneCursor runs selections from many goroutines, some made in
// the callers and some through the actors: one goroutine at a time uses the group, so the
// round-robin cursor is never read twice and every engine gets exactly its share (a race
// would also fail under -race).
func TestConcurrentSelectsShareOneCursor(t *testing.T) {
	ws := workers("W", 4, engine.StagePlain)
	b := plainBucket("plain", 4096, engine.NewRoundRobin(nil, nil), nil)
	s := newTestSelector(t, workerSet(t, ws), config.Actors{Mailbox: config.Mailbox{Bucket: 4096, Group: 4096}}, nil, b)
	res := engine.NewBucketResolver(testModel, []*engine.Bucket{b})

	const goroutines, each = 8, 400
	var (
		wg     sync.WaitGroup
		mu     sync.Mutex
		counts = map[string]int{}
		errs   []error
	)
	for g := range goroutines {
		wg.Go(func() {
			for i := range each {
				var (
					p   engine.BucketPick
					err error
				)
				if (g+i)%4 == 0 {
					p, err = s.PickEngines(b, request(10))
				} else {
					p, err = s.Select(res, request(10))
				}
				mu.Lock()
				if err != nil {
					errs = append(errs, err)
				} else {
					counts[p.Plain.Worker.ID]++
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if len(errs) > 0 {
		t.Fatalf("%d failed picks, first: %v", len(errs), errs[0])
	}
	for _, w := range ws {
		if counts[w.ID] != goroutines*each/len(ws) {
			t.Errorf("picks = %v, want %d each", counts, goroutines*each/len(ws))
			break
		}
	}
}
