package actors

import (
	"switchyard/load/series"
	"testing"
	"time"

	"github.com/VictoriaMetrics/metrics"
)

var affT0 = time.Unix(1_800_000_000, 0)

// affAt returns affT0 plus d, in UnixNano as the table takes it.
func affAt(d time.Duration) int64 { return affT0.Add(d).UnixNano() }

func newTestTable(idle time.Duration, maxBindings int) (*bindingTable, *scopeStats) {
	st := newScopeStats(series.Own(nil), "scope", "t")
	return newBindingTable(idle, maxBindings, st), st
}

// affOp is one step of a table test: an operation on the table and the worker ID (or count)
// it must return.
type affOp struct {
	op                  string // lookup, bind, sweep, invalidate
	at                  time.Duration
	key, expect, worker string
	want                string
	wantN               int
}

func TestBindingTable(t *testing.T) {
	const idle = 600 * time.Second
	tests := []struct {
		name      string
		max       int
		ops       []affOp
		wantLen   int
		wantStats map[string]uint64 // counter name -> value
	}{
		{
			name: "compare-and-set",
			max:  10,
			ops: []affOp{
				{op: "lookup", key: "k", want: ""},
				{op: "bind", key: "k", expect: "", worker: "W1", want: "W1"},
				{op: "bind", key: "k", expect: "", worker: "W2", want: "W1"},   // a second first bind loses to W1
				{op: "bind", key: "k", expect: "W9", worker: "W2", want: "W1"}, // wrong expectation
				{op: "bind", key: "k", expect: "W1", worker: "W2", want: "W2"}, // replacement
				{op: "bind", key: "k", expect: "W2", worker: "W2", want: "W2"}, // idempotent
				{op: "lookup", key: "k", want: "W2"},
			},
			wantLen:   1,
			wantStats: map[string]uint64{"binds": 3, "conflicts": 2, "hits": 1, "misses": 1},
		},
		{
			name: "a use refreshes the idle time",
			max:  10,
			ops: []affOp{
				{op: "bind", key: "k", worker: "W1", want: "W1"},
				{op: "lookup", at: 500 * time.Second, key: "k", want: "W1"},
				{op: "lookup", at: 1000 * time.Second, key: "k", want: "W1"},
				{op: "lookup", at: 1599 * time.Second, key: "k", want: "W1"},
				{op: "lookup", at: 2199 * time.Second, key: "k", want: ""}, // idle exactly 600s: expired
			},
			wantLen:   0,
			wantStats: map[string]uint64{"expired": 1, "hits": 3, "misses": 1},
		},
		{
			name: "an expired binding is absent to bind",
			max:  10,
			ops: []affOp{
				{op: "bind", key: "k", worker: "W1", want: "W1"},
				{op: "bind", at: 600 * time.Second, key: "k", expect: "", worker: "W2", want: "W2"},
				{op: "lookup", at: 601 * time.Second, key: "k", want: "W2"},
			},
			wantLen:   1,
			wantStats: map[string]uint64{"expired": 1, "binds": 2},
		},
		{
			name: "time never moves a binding backwards",
			max:  10,
			ops: []affOp{
				{op: "bind", at: 100 * time.Second, key: "k", worker: "W1", want: "W1"},
				{op: "lookup", at: 50 * time.Second, key: "k", want: "W1"}, // an older request's clock
				{op: "sweep", at: 699 * time.Second, wantN: 0},
				{op: "sweep", at: 700 * time.Second, wantN: 1},
			},
			wantLen: 0,
		},
		{
			name: "sweep removes only expired bindings",
			max:  10,
			ops: []affOp{
				{op: "bind", key: "a", worker: "W1", want: "W1"},
				{op: "bind", at: 300 * time.Second, key: "b", worker: "W1", want: "W1"},
				{op: "sweep", at: 599 * time.Second, wantN: 0},
				{op: "sweep", at: 600 * time.Second, wantN: 1},
				{op: "lookup", at: 600 * time.Second, key: "b", want: "W1"},
				{op: "sweep", at: 1199 * time.Second, wantN: 0},
				{op: "sweep", at: 1200 * time.Second, wantN: 1},
			},
			wantLen:   0,
			wantStats: map[string]uint64{"expired": 2},
		},
		{
			name: "the least recently used binding is evicted beyond the bound",
			max:  3,
			ops: []affOp{
				{op: "bind", at: 1, key: "a", worker: "W1", want: "W1"},
				{op: "bind", at: 2, key: "b", worker: "W2", want: "W2"},
				{op: "bind", at: 3, key: "c", worker: "W3", want: "W3"},
				{op: "lookup", at: 4, key: "a", want: "W1"},
				{op: "bind", at: 5, key: "d", worker: "W4", want: "W4"}, // evicts b
				{op: "lookup", at: 6, key: "b", want: ""},
				{op: "lookup", at: 7, key: "a", want: "W1"},
				{op: "lookup", at: 8, key: "c", want: "W3"},
				{op: "lookup", at: 9, key: "d", want: "W4"},
			},
			wantLen:   3,
			wantStats: map[string]uint64{"evicted": 1, "binds": 4},
		},
		{
			name: "an expired tail makes room as expired, not evicted",
			max:  2,
			ops: []affOp{
				{op: "bind", key: "a", worker: "W1", want: "W1"},
				{op: "bind", at: 300 * time.Second, key: "b", worker: "W1", want: "W1"},
				{op: "bind", at: 600 * time.Second, key: "c", worker: "W1", want: "W1"},
			},
			wantLen:   2,
			wantStats: map[string]uint64{"expired": 1, "evicted": 0},
		},
		{
			name: "invalidation drops the worker's bindings only",
			max:  10,
			ops: []affOp{
				{op: "bind", key: "a", worker: "W1", want: "W1"},
				{op: "bind", key: "b", worker: "W2", want: "W2"},
				{op: "bind", key: "c", worker: "W1", want: "W1"},
				{op: "invalidate", worker: "W1", wantN: 2},
				{op: "invalidate", worker: "W1", wantN: 0},
				{op: "lookup", key: "a", want: ""},
				{op: "lookup", key: "b", want: "W2"},
				{op: "lookup", key: "c", want: ""},
				{op: "bind", key: "a", worker: "W3", want: "W3"}, // a new first bind
			},
			wantLen:   2,
			wantStats: map[string]uint64{"invalidated": 2},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tab, st := newTestTable(idle, tt.max)
			for i, op := range tt.ops {
				now := affAt(op.at)
				switch op.op {
				case "lookup":
					if got := tab.lookup(op.key, now); got != op.want {
						t.Fatalf("step %d: lookup(%s) = %q, want %q", i, op.key, got, op.want)
					}
				case "bind":
					got, set := tab.bind(op.key, op.expect, op.worker, now)
					if got != op.want || set != (op.want == op.worker) {
						t.Fatalf("step %d: bind(%s, %q, %s) = %q, %v; want %q", i, op.key, op.expect, op.worker, got, set, op.want)
					}
				case "sweep":
					if n := tab.sweep(now); n != op.wantN {
						t.Fatalf("step %d: sweep = %d, want %d", i, n, op.wantN)
					}
				case "invalidate":
					if n := tab.invalidate(op.worker); n != op.wantN {
						t.Fatalf("step %d: invalidate = %d, want %d", i, n, op.wantN)
					}
				default:
					t.Fatalf("BUG: unknown op %q", op.op)
				}
				checkList(t, tab)
			}
			if tab.len() != tt.wantLen || st.bindings.Load() != int64(tt.wantLen) {
				t.Fatalf("len %d, bindings gauge %d, want %d", tab.len(), st.bindings.Load(), tt.wantLen)
			}
			counters := map[string]*metrics.Counter{"hits": st.hits, "misses": st.misses, "binds": st.binds, "conflicts": st.conflicts,
				"expired": st.expired, "evicted": st.evicted, "invalidated": st.invalidated}
			for name, want := range tt.wantStats {
				if got := counters[name].Get(); got != want {
					t.Fatalf("%s = %d, want %d", name, got, want)
				}
			}
		})
	}
}

func TestBindingTableClear(t *testing.T) {
	tab, st := newTestTable(time.Minute, 10)
	for _, k := range []string{"a", "b", "c"} {
		tab.bind(k, "", "W1", affAt(0))
	}
	tab.clear()
	if tab.len() != 0 || st.bindings.Load() != 0 || tab.lookup("a", affAt(0)) != "" {
		t.Fatalf("clear left %d bindings (gauge %d)", tab.len(), st.bindings.Load())
	}
	checkList(t, tab)
}

// TestBindingTableRecyclesEntries: at the bound, a stream of first binds evicts and reuses
// entries instead of allocating.
func TestBindingTableRecyclesEntries(t *testing.T) {
	tab, st := newTestTable(time.Hour, 64)
	keys := make([]string, 4096)
	for i := range keys {
		keys[i] = "key-" + string(rune('a'+i%26)) + string(rune('a'+i/26%26)) + string(rune('a'+i/676))
	}
	for i, k := range keys {
		tab.bind(k, "", "W1", affAt(time.Duration(i)))
	}
	if tab.len() != 64 || st.evicted.Get() != uint64(len(keys)-64) {
		t.Fatalf("len %d evicted %d", tab.len(), st.evicted.Get())
	}
	checkList(t, tab)
}

// checkList verifies the LRU list against the map: same entries, consistent links, and last
// use never increasing from head to tail.
func checkList(t *testing.T, tab *bindingTable) {
	t.Helper()
	n := 0
	var prev *binding
	for b := tab.head; b != nil; b = b.next {
		if b.prev != prev {
			t.Fatalf("broken prev link at %q", b.key)
		}
		if tab.byKey[b.key] != b {
			t.Fatalf("listed entry %q is not in the map", b.key)
		}
		prev = b
		n++
		if n > len(tab.byKey) {
			t.Fatal("list longer than the map (cycle?)")
		}
	}
	if tab.tail != prev || n != len(tab.byKey) {
		t.Fatalf("list has %d entries (tail ok %v), map %d", n, tab.tail == prev, len(tab.byKey))
	}
}

// A partition grain's table reports the change or removal of a binding another replica read
// lately (it keeps a copy in its near cache), and only those.
func TestBindingTableReportsChangesOfRemotelyReadBindings(t *testing.T) {
	const idle, watch = 600 * time.Second, 60 * time.Second
	tests := []struct {
		name string
		run  func(tb *bindingTable)
		want int
	}{
		{"rebind of a read binding", func(tb *bindingTable) {
			tb.bind("k", "", "W1", affAt(0))
			tb.readRemotely("k", affAt(time.Second))
			tb.bind("k", "W1", "W2", affAt(2*time.Second))
		}, 1},
		{"rebind to the same worker", func(tb *bindingTable) {
			tb.bind("k", "", "W1", affAt(0))
			tb.readRemotely("k", affAt(time.Second))
			tb.bind("k", "W1", "W1", affAt(2*time.Second))
		}, 0},
		{"rebind of a binding nobody read", func(tb *bindingTable) {
			tb.bind("k", "", "W1", affAt(0))
			tb.bind("k", "W1", "W2", affAt(2*time.Second))
		}, 0},
		{"rebind long after the read", func(tb *bindingTable) {
			tb.bind("k", "", "W1", affAt(0))
			tb.readRemotely("k", affAt(time.Second))
			tb.bind("k", "W1", "W2", affAt(time.Second+watch))
		}, 0},
		{"invalidation of a read binding", func(tb *bindingTable) {
			tb.bind("k", "", "W1", affAt(0))
			tb.bind("j", "", "W2", affAt(0))
			tb.readRemotely("k", affAt(time.Second))
			tb.invalidate("W1")
			tb.invalidate("W2")
		}, 1},
		{"eviction of a read binding", func(tb *bindingTable) {
			tb.bind("k", "", "W1", affAt(0))
			tb.readRemotely("k", affAt(time.Second))
			tb.bind("j", "", "W2", affAt(2*time.Second))
			tb.bind("i", "", "W2", affAt(3*time.Second)) // evicts k (max 2)
		}, 1},
		{"expiry of a read binding", func(tb *bindingTable) {
			tb.bind("k", "", "W1", affAt(0))
			tb.readRemotely("k", affAt(time.Second))
			tb.bind("k", "", "W2", affAt(2*time.Second+idle)) // k expired: a new binding
			tb.sweep(affAt(3 * idle))
		}, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tb, _ := newTestTable(idle, 2)
			n := 0
			tb.watch, tb.onRemoteChange = int64(watch), func() { n++ }
			tt.run(tb)
			if n != tt.want {
				t.Fatalf("onRemoteChange called %d times, want %d", n, tt.want)
			}
		})
	}
}
