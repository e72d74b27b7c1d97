package actors

import (
	"errors"
	"testing"
	"time"

	"switchyard/config"
	"switchyard/engine"
	"switchyard/load"
)

// TestPickTimeoutGivesBackAdapterSlot: a selection whose caller stopped waiting (the pick
// deadline passed while the policy ran) and that then reserved an adapter slot gives the slot
// back: nobody will load the adapter for it.
func TestPickTimeoutGivesBackAdapterSlot(t *testing.T) {
	ws := workers("W", 1, engine.StagePlain)
	w := ws[0]
	w.SetAdapters(engine.NewAdapterSet(nil, 1))
	woken := make(chan string, 4)
	w.AdapterRoom = func(model string) { woken <- model }
	pol := newTestPolicy()
	b := plainBucket("short", 4096, pol, nil)
	b.Plain.SetAdapterLoading(time.Minute, nil)
	s := newTestSelector(t, workerSet(t, ws), config.Actors{PickTimeout: 20 * time.Millisecond}, nil, b)

	blockPick(t, s, b, pol, func() *engine.BucketRequest {
		req := requestFor(10, markBlock, "W1")
		req.Adapter = "math"
		return req
	})
	if now := time.Unix(1000, 0); !w.Adapters().Free(now) {
		t.Fatal("the slot was taken before the blocked pick ended")
	}
	close(pol.release) // the blocked pick reserves W1's slot and replies into its abandoned call
	// The group actor handles one pick at a time: once the next one is answered, the late
	// reply has been given back.
	if _, err := s.PickEngines(b, request(10)); err != nil {
		t.Fatal(err)
	}
	if now := time.Unix(1000, 0); !w.Adapters().Free(now) || w.Adapters().Loading("math", now) {
		t.Fatal("the abandoned selection still holds W1's adapter slot")
	}
	select {
	case m := <-woken:
		if m != testModel {
			t.Fatalf("AdapterRoom(%q), want %q", m, testModel)
		}
	default:
		t.Fatal("AdapterRoom was not told of the slot given back")
	}
}

// panicLoads is a load table whose read panics, as a broken one would.
type panicLoads struct{}

func (panicLoads) Load() *load.Snapshot { panic("test load table: read") }

// panicPrefix is a prefix lookup whose answer panics, as a broken one would.
type panicPrefix struct{}

func (panicPrefix) MatchedTokens(string) int64                { panic("test prefix lookup: matched tokens") }
func (panicPrefix) Status() (ok, unavailable bool, err error) { panic("test prefix lookup: status") }

// TestPanicAfterReserveGivesBackAdapterSlot: a selection that panics after its group
// reserved an adapter slot and before the pick reached the selection (in the rank dispatch,
// or in the PD bypass test) fails its request and gives the slot back at once, whether the
// request's goroutine or the group actors made it.
func TestPanicAfterReserveGivesBackAdapterSlot(t *testing.T) {
	tests := []struct {
		name   string
		bucket func() (*engine.Bucket, *engine.Worker, []*engine.Worker)
		req    func(*engine.BucketRequest)
	}{
		{name: "rank dispatch", bucket: func() (*engine.Bucket, *engine.Worker, []*engine.Worker) {
			ws := workers("W", 1, engine.StagePlain)
			ws[0].DPSize = 2
			b := plainBucket("b", engine.Unbounded, engine.NewRoundRobin(nil, nil), nil)
			b.Plain.SetRankDispatch(panicLoads{}, 0)
			b.Plain.SetAdapterLoading(time.Minute, nil)
			return b, ws[0], ws
		}},
		{name: "bypass test", bucket: func() (*engine.Bucket, *engine.Worker, []*engine.Worker) {
			ps, ds := workers("P", 1, engine.StagePrefill), workers("D", 1, engine.StageDecode)
			ds[0].CanPrefill = true
			b := pdBucket("b", engine.Unbounded, engine.NewRoundRobin(nil, nil), engine.NewRoundRobin(nil, nil), nil, nil)
			b.BypassBelow = 64
			b.Decode.SetAdapterLoading(time.Minute, nil)
			return b, ds[0], append(ps, ds...)
		}, req: func(r *engine.BucketRequest) { r.Prefix = panicPrefix{} }},
	}
	for _, tt := range tests {
		for _, path := range []string{"request goroutine", "actors"} {
			t.Run(tt.name+", "+path, func(t *testing.T) {
				b, w, ws := tt.bucket()
				for _, x := range ws {
					x.SetAdapters(engine.NewAdapterSet(nil, 1))
				}
				s := newTestSelector(t, workerSet(t, ws), config.Actors{}, nil, b)
				req := request(10)
				req.Adapter = "math"
				if tt.req != nil {
					tt.req(req)
				}
				var err error
				if path == "actors" {
					_, err = s.PickEngines(b, req)
				} else {
					_, err = s.Select(resolvers(b)[testModel], req)
				}
				if !errors.Is(err, ErrPanicked) {
					t.Fatalf("err = %v, want the selection's panic", err)
				}
				if s := w.Adapters(); !s.Free(req.Now) || s.Loading("math", req.Now) {
					t.Fatalf("%s's adapter slot is still reserved after the selection panicked", w.ID)
				}
			})
		}
	}
}
