package fleet

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/VictoriaMetrics/metrics"

	"switchyard/config"
	"switchyard/engine"
	"switchyard/load"
)

func TestDecodeModelList(t *testing.T) {
	for _, tc := range []struct {
		name     string
		body     string
		adapters []string
		wantErr  bool
	}{
		{name: "vLLM with adapters", body: `{"object":"list","data":[{"id":"base","root":"/m","parent":null},{"id":"sql","root":"/a/sql","parent":"base"},{"id":"math","parent":"base"}]}`,
			adapters: []string{"sql", "math"}},
		{name: "base only (SGLang)", body: `{"data":[{"id":"base"}]}`},
		{name: "entries without an id are skipped", body: `{"data":[{"parent":"base"},{"id":"x","parent":"x"}]}`},
		{name: "not a list", body: `{"data":{}}`, wantErr: true},
		{name: "not JSON", body: `<html>`, wantErr: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := DecodeModelList([]byte(tc.body))
			if (err != nil) != tc.wantErr {
				t.Fatalf("err = %v", err)
			}
			var adapters []string
			for i := range got {
				if got[i].IsAdapter() {
					adapters = append(adapters, got[i].ID)
				}
			}
			if len(adapters) != len(tc.adapters) {
				t.Fatalf("adapters %v, want %v", adapters, tc.adapters)
			}
			for i := range adapters {
				if adapters[i] != tc.adapters[i] {
					t.Fatalf("adapters %v, want %v", adapters, tc.adapters)
				}
			}
		})
	}
}

func TestDecodeInfoLoRASlots(t *testing.T) {
	for body, want := range map[string]int{
		`{"model_path":"m","max_loaded_loras":4,"max_loras_per_batch":2}`: 4,
		`{"model_path":"m","max_loras_per_batch":"8"}`:                    8,
		`{"model_path":"m","max_loaded_loras":null}`:                      0,
		`{"model_path":"m","max_loaded_loras":-3}`:                        0,
	} {
		info, err := DecodeInfo([]byte(body))
		if err != nil || info.LoRASlots != want {
			t.Errorf("%s: slots %d err %v, want %d", body, info.LoRASlots, err, want)
		}
	}
}

func FuzzDecodeModelList(f *testing.F) {
	f.Add([]byte(`{"data":[{"id":"a","parent":"b","root":"c"}]}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		got, err := DecodeModelList(body)
		if err != nil {
			return
		}
		if len(got) > maxModelEntries {
			t.Fatalf("%d entries", len(got))
		}
		for i := range got {
			if got[i].ID == "" {
				t.Fatal("an entry without an id")
			}
		}
	})
}

// TestAdapterSlotsKnownBeforeTheFirstList: a worker added with LoRA routing on knows its
// introspected adapter slots before the router first reads its adapter list, so loads
// started meanwhile cannot overfill the engine (a second adapter on a one-slot engine was
// refused by the engine and answered 502).
func TestAdapterSlotsKnownBeforeTheFirstList(t *testing.T) {
	e := newTestEngine(t, `{"model_path":"m","max_loaded_loras":1}`)
	f, _ := loraFleet(t, 8, nil)
	m, err := f.Add(context.Background(), Spec{URL: e.url, ID: "L"}, true) // introspected; the fleet is not started: no list read
	if err != nil {
		t.Fatal(err)
	}
	w := m.Worker()
	if s := w.Adapters(); s == nil || s.Slots != 1 {
		t.Fatalf("adapter set %+v before the first list, want 1 slot", s)
	}
	now := time.Now()
	if _, ok := w.ReserveAdapter("a", now, now.Add(time.Minute), nil); !ok {
		t.Fatal("no room for a first adapter")
	}
	if _, ok := w.ReserveAdapter("b", now, now.Add(time.Minute), nil); ok {
		t.Fatal("a second adapter found room on a one-slot engine")
	}
}

// TestAdapterSlotsFollowLateFacts: an engine whose facts are not known when its adapters are
// first learned (its introspection failed: not ready yet) counts Options.AdapterSlots until
// they arrive, then the slots they advertise, at once (not at the next adapter refresh),
// whether its worker stays the same or is republished; the adapters learned stay, and more
// slots than counted tell Options.AdapterRoom.
func TestAdapterSlotsFollowLateFacts(t *testing.T) {
	tests := []struct {
		name     string
		info     string
		want     int
		wantRoom []string
	}{
		{name: "fewer slots, the same worker", info: `{"model_path":"m","max_loaded_loras":2}`, want: 2},
		{name: "more slots, the worker republished", info: `{"model_path":"m","max_loaded_loras":16,"dp_size":2}`, want: 16,
			wantRoom: []string{"m"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newTestEngine(t, tt.info)
			e.infoStatus.Store(503)
			models := `{"data":[{"id":"m"},{"id":"sql","parent":"m"}]}`
			e.models.Store(&models)
			var room []string
			f, _ := loraFleet(t, 8, func(model string) { room = append(room, model) })
			ctx := context.Background()
			m, err := f.Add(ctx, Spec{URL: e.url, ID: "L", Model: "m"}, true) // introspection fails: the given facts
			if err != nil {
				t.Fatal(err)
			}
			f.RefreshAdapters(ctx, m)
			if s := m.Worker().Adapters(); !s.Has("sql") || s.Slots != 8 {
				t.Fatalf("before the facts: %v with %d slots, want sql with lora.slots_per_engine's 8", s.Names(), s.Slots)
			}
			if !slices.Equal(room, []string{"m"}) {
				t.Fatalf("room told for %v after the first list, want [m] (sql, not known before, may be evicted)", room)
			}
			room = nil
			before := m.Worker()
			e.infoStatus.Store(0)
			f.CheckOnce(ctx, m) // the facts arrive
			if m.info.Load() == nil {
				t.Fatal("the facts were not learned")
			}
			if republished := m.Worker() != before; republished != (tt.wantRoom != nil) {
				t.Fatalf("worker republished %v", republished)
			}
			if s := m.Worker().Adapters(); !s.Has("sql") || s.Slots != tt.want {
				t.Fatalf("after the facts: %v with %d slots, want sql with %d", s.Names(), s.Slots, tt.want)
			}
			if !slices.Equal(room, tt.wantRoom) {
				t.Fatalf("room told for %v, want %v", room, tt.wantRoom)
			}
			f.RefreshAdapters(ctx, m) // the next list keeps them
			if s := m.Worker().Adapters(); s.Slots != tt.want || !slices.Equal(room, tt.wantRoom) {
				t.Fatalf("after the next list: %d slots, room told for %v", s.Slots, room)
			}
		})
	}
}

// TestAdapterLoadsEndOnTheRebuiltWorker: an engine whose worker is rebuilt (its facts arrive
// and change the worker) while the router loads adapters there keeps one adapter state: a
// load that ends on the worker it was picked through, the old one, reaches the worker
// published, whether it succeeded (the adapter is held) or failed (its slot is free).
func TestAdapterLoadsEndOnTheRebuiltWorker(t *testing.T) {
	e := newTestEngine(t, `{"model_path":"m","max_loaded_loras":4,"dp_size":2}`)
	e.infoStatus.Store(503)
	models := `{"data":[{"id":"m"}]}`
	e.models.Store(&models)
	f, ws := loraFleet(t, 2, nil)
	ctx := context.Background()
	m, err := f.Add(ctx, Spec{URL: e.url, ID: "L", Model: "m"}, true) // introspection fails: the given facts
	if err != nil {
		t.Fatal(err)
	}
	f.RefreshAdapters(ctx, m)
	old := m.Worker()
	now := time.Now()
	for _, a := range []string{"math", "sql"} { // two picks through the old worker, their loads under way
		if _, ok := old.ReserveAdapter(a, now, now.Add(time.Hour), nil); !ok {
			t.Fatalf("no slot for %s", a)
		}
	}
	e.infoStatus.Store(0)
	f.CheckOnce(ctx, m) // the facts arrive: two ranks, a new worker
	w := m.Worker()
	if w == old || ws.Load().Worker("L") != w {
		t.Fatal("the worker was not rebuilt and published")
	}
	old.AddAdapter("math", now) // math's load ends on the old worker
	old.ReleaseAdapter("sql")   // sql's load fails there
	s := w.Adapters()
	if !s.Has("math") || s.Loading("math", now) || s.Loading("sql", now) {
		t.Fatalf("the published worker: adapters %v, loading math %v, loading sql %v; want math held and no load",
			s.Names(), s.Loading("math", now), s.Loading("sql", now))
	}
	if n := s.FreeSlots(now); n != 3 {
		t.Fatalf("the published worker has %d free slots, want 3 (4 less math)", n)
	}
	if _, ok := w.HoldAdapter("math", now); !ok {
		t.Fatal("a request cannot hold math on the published worker")
	}
}

// loraFleet returns a fleet, not started, of an empty worker set (also returned) with LoRA
// routing on: adapter lists read when a test asks (RefreshAdapters), slots engines that do
// not advertise theirs, and room told to room (nil: nobody). It is stopped when the test ends.
func loraFleet(t *testing.T, slots int, room func(model string)) (*Fleet, *engine.WorkerSet) {
	t.Helper()
	ws, err := engine.NewWorkerSet(nil)
	if err != nil {
		t.Fatal(err)
	}
	cfg := config.Default()
	cfg.Health.Interval = time.Hour
	f := New(ws, Options{Health: cfg.Health, Upstream: cfg.Upstream, Tracker: load.NewTracker(), Metrics: metrics.NewSet(),
		AdapterRefresh: time.Hour, AdapterSlots: slots, AdapterRoom: room})
	t.Cleanup(func() {
		f.Stop()
		f.CloseConnections()
	})
	return f, ws
}
