package loadgen

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"switchyard/bench/workload"
)

// fakeSender records the order in which requests are sent and answers each with a 200.
// When hold is set, every send waits until the last request of the run has been sent, so
// that every request is in flight at once.
type fakeSender struct {
	last int // index of the run's last request
	hold bool

	mu       sync.Mutex
	order    []int
	inflight int
	peak     int
	released chan struct{}
}

func newFakeSender(n int, hold bool) *fakeSender {
	return &fakeSender{last: n - 1, hold: hold, released: make(chan struct{})}
}

func (f *fakeSender) do(ctx context.Context, _ string, _ []byte, _ *workload.Request, res *Result, _ time.Time, sent func()) {
	f.mu.Lock()
	f.order = append(f.order, res.Index)
	f.inflight++
	f.peak = max(f.peak, f.inflight)
	if res.Index == f.last {
		close(f.released)
	}
	f.mu.Unlock()
	if sent != nil {
		sent()
	}
	if f.hold {
		select {
		case <-f.released:
		case <-ctx.Done():
		}
	}
	f.mu.Lock()
	f.inflight--
	f.mu.Unlock()
	res.Status, res.E2E = 200, time.Millisecond
}

func (f *fakeSender) close() {}

// conversations returns n trace requests: n/turns conversations of turns turns each, the
// turns of one conversation interleaved with the others' and all arriving within a
// millisecond, so that a replay sends them nearly at once.
func conversations(n, turns int) []workload.Request {
	reqs := make([]workload.Request, n)
	for i := range reqs {
		reqs[i] = workload.Request{Class: fmt.Sprintf("conversation %d turn %d", i%(n/turns), i/(n/turns)),
			MaxTokens: 1, After: -1, At: time.Duration(i) * time.Microsecond}
	}
	return reqs
}

// TestReplaySendsInOrder: a replayed trace's requests are sent in their recorded order, so
// a conversation's next turn never leaves before the turn it extends, however many are in
// flight and whatever the bound on them. (A goroutine per request sent them in the order the
// goroutines happened to run.)
func TestReplaySendsInOrder(t *testing.T) {
	const n = 400
	tests := []struct {
		name           string
		maxOutstanding int
		hold           bool
		wantPeak       int
	}{
		{name: "every request in flight", hold: true, wantPeak: n},
		{name: "bounded", maxOutstanding: 3, wantPeak: 3},
		{name: "one at a time", maxOutstanding: 1, wantPeak: 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			reqs := conversations(n, 4)
			f := newFakeSender(n, tt.hold)
			m, err := measure(context.Background(), Config{URLs: []string{"http://127.0.0.1:1"}, Model: "m", Replay: 1000,
				MaxOutstanding: tt.maxOutstanding}, reqs, f)
			if err != nil {
				t.Fatal(err)
			}
			if len(m.Results) != n || m.Truncated {
				t.Fatalf("%d results, truncated %v", len(m.Results), m.Truncated)
			}
			for k, i := range f.order {
				if i != k {
					t.Fatalf("send %d was request %d (%s), want request %d (%s): sent out of order",
						k, i, reqs[i].Class, k, reqs[k].Class)
				}
			}
			if tt.hold && f.peak != tt.wantPeak || f.peak > tt.wantPeak {
				t.Errorf("peak %d requests in flight, want %d", f.peak, tt.wantPeak)
			}
		})
	}
}

// TestReplayReportsLateness: an open-loop request records how long after its arrival it was
// sent, and a request that waited for its dependency counts from the dependency's completion.
// The clock reads the run's start once, then 50 ms later for ever: the scheduler never waits
// and every request leaves at 50 ms.
func TestReplayReportsLateness(t *testing.T) {
	t0 := time.Unix(1000, 0)
	var started atomic.Bool
	now := func() time.Time {
		if started.CompareAndSwap(false, true) {
			return t0
		}
		return t0.Add(50 * time.Millisecond)
	}
	reqs := requests(4)
	for i := range reqs {
		reqs[i].At = time.Duration(i) * 10 * time.Millisecond
	}
	reqs[3].After = 2 // its dependency completes at 50 ms: it is sent on time
	f := newFakeSender(len(reqs), false)
	m, err := measure(context.Background(), Config{URLs: []string{"http://127.0.0.1:1"}, Model: "m", Replay: 1, Now: now}, reqs, f)
	if err != nil {
		t.Fatal(err)
	}
	want := []time.Duration{50 * time.Millisecond, 40 * time.Millisecond, 30 * time.Millisecond, 0}
	if len(m.Results) != len(want) {
		t.Fatalf("%d results, want %d", len(m.Results), len(want))
	}
	for i, r := range m.Results {
		if r.Late != want[i] || r.Start != 50*time.Millisecond {
			t.Errorf("request %d: sent at %v, %v late; want at 50ms, %v late", i, r.Start, r.Late, want[i])
		}
	}

	// A closed loop has no arrivals to be late for.
	started.Store(false)
	m, err = measure(context.Background(), Config{URLs: []string{"http://127.0.0.1:1"}, Model: "m", Now: now}, requests(3), newFakeSender(3, false))
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range m.Results {
		if r.Late != 0 {
			t.Errorf("closed loop request %d: %v late", i, r.Late)
		}
	}
}
