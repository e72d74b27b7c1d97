package actors

import (
	"testing"
	"time"

	"switchyard/config"
	"switchyard/engine"
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
