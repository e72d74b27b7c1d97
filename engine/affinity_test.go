package engine

import (
	"cmp"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"switchyard/load"
)

// memAffinity is a hand-written AffinityStore: one map per scope with compare-and-set, call
// counts, a hook that stages a concurrent binding just before a Bind applies, and injected
// failures (of every call, or of binds only). Expiry and bounds belong to the real store (package actors) and are tested there.
type memAffinity struct {
	mu      sync.Mutex
	m       map[AffinityScope]map[string]string
	lookups int
	binds   int
	// beforeBind, when set, runs before each Bind applies (under the lock): a concurrent
	// request's binding landing between this pick's Lookup and its Bind.
	beforeBind func(m map[string]string, key, id string)
	err        error
	bindErr    error
}

var _ AffinityStore = (*memAffinity)(nil)

func newMemAffinity() *memAffinity {
	return &memAffinity{m: make(map[AffinityScope]map[string]string)}
}

func (s *memAffinity) scope(sc AffinityScope) map[string]string {
	m := s.m[sc]
	if m == nil {
		m = make(map[string]string)
		s.m[sc] = m
	}
	return m
}

func (s *memAffinity) Lookup(sc AffinityScope, key string, _ time.Time) (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.lookups++
	if s.err != nil {
		return "", s.err
	}
	return s.scope(sc)[key], nil
}

func (s *memAffinity) Bind(sc AffinityScope, key, expect, id string, _ time.Time) (string, bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.binds++
	if err := cmp.Or(s.err, s.bindErr); err != nil {
		return "", false, err
	}
	m := s.scope(sc)
	if s.beforeBind != nil {
		s.beforeBind(m, key, id)
	}
	if m[key] != expect {
		return m[key], false, nil
	}
	m[key] = id
	return id, true, nil
}

// bound returns key's binding in sc ("" for none).
func (s *memAffinity) bound(sc AffinityScope, key string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.m[sc][key]
}

// set binds key in sc directly.
func (s *memAffinity) set(sc AffinityScope, key, id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.scope(sc)[key] = id
}

// keyedPolicy gives every request it forwards a session and a routing key, so that the
// contract suite runs the affinity policies through their binding path too.
type keyedPolicy struct {
	Policy
	key string
}

func (k keyedPolicy) Pick(c []*Worker, req *PickRequest) (Pick, error) {
	br := *req.BucketRequest
	br.SessionKey, br.RoutingKey = k.key, k.key
	pr := *req
	pr.BucketRequest = &br
	return k.Policy.Pick(c, &pr)
}

// affinityKind is one of the two affinity policies as the shared rule table sees it.
type affinityKind struct {
	name                  string
	noKey, reuse, rebound string
	mk                    func(adm EngineAdmission, loads LoadReader, store AffinityStore) Policy
	withKey               func(r *BucketRequest, key string)
}

func affinityKinds() []affinityKind {
	return []affinityKind{
		{
			name: PolicySessionAware, noKey: ReasonNoSession, reuse: ReasonSessionPrimary, rebound: ReasonSessionRebound,
			mk: func(adm EngineAdmission, loads LoadReader, store AffinityStore) Policy {
				return NewSessionAware(adm, loads, store, testRNG())
			},
			withKey: func(r *BucketRequest, key string) { r.SessionKey = key },
		},
		{
			name: PolicySticky, noKey: ReasonNoRoutingKey, reuse: ReasonHit, rebound: ReasonRemap,
			mk: func(adm EngineAdmission, loads LoadReader, store AffinityStore) Policy {
				return NewSticky(adm, loads, store, NewPowerOfTwo(nil, loads, testRNG()))
			},
			withKey: func(r *BucketRequest, key string) { r.RoutingKey = key },
		},
	}
}

// keyReq is pickReq(stage) carrying key in the field kind reads.
func (k affinityKind) keyReq(stage Stage, key string) *PickRequest {
	req := pickReq(stage)
	k.withKey(req.BucketRequest, key)
	return req
}

// TestAffinityRules runs every binding rule of POLICY_DESIGN section 5 against both affinity
// policies. Candidates are w0..w3; w3 carries by far the highest load, so a load-aware
// fallback never chooses it and it can play the concurrent winner or the pressured binding.
func TestAffinityRules(t *testing.T) {
	const anyW = "*" // the fallback's choice, whichever candidate it is
	tests := []struct {
		name       string
		key        string
		bound      string   // binding before the pick; may name a non-candidate ("gone")
		winner     string   // binding a concurrent request makes before this pick's Bind
		missed     string   // "lookup": every store call misses its deadline; "bind": binds do
		reject     []string // IDs this policy's admission rejects
		wantWorker string   // "" on error, anyW, or an ID
		wantReason string   // noKey, reuse, rebound, assigned, store_timeout (mapped per policy)
		wantErr    Outcome
		wantBound  string // binding after the pick: "" none, anyW = the picked worker, or an ID
		wantAdm    int    // admission calls
		wantBinds  int    // Bind calls
	}{
		{name: "missing key: fallback, nothing bound", key: "", wantWorker: anyW, wantReason: "noKey", wantAdm: 1},
		{name: "new key is bound to the admitted fallback engine", key: "k", wantWorker: anyW, wantReason: ReasonAssigned, wantBound: anyW, wantAdm: 1, wantBinds: 1},
		{name: "bound engine reused whatever its pressure", key: "k", bound: "w3", wantWorker: "w3", wantReason: "reuse", wantBound: "w3", wantAdm: 1},
		{name: "bound engine rejected: AdmissionRejected, binding kept", key: "k", bound: "w3", reject: []string{"w3"}, wantErr: OutcomeAdmissionRejected, wantBound: "w3", wantAdm: 1},
		{name: "binding outside the group is replaced", key: "k", bound: "gone", wantWorker: anyW, wantReason: "rebound", wantBound: anyW, wantAdm: 1, wantBinds: 1},
		{name: "fallback engine rejected: nothing bound", key: "k", reject: []string{"w0", "w1", "w2", "w3"}, wantErr: OutcomeAdmissionRejected, wantAdm: 1},
		{name: "replacement rejected: old binding kept", key: "k", bound: "gone", reject: []string{"w0", "w1", "w2", "w3"}, wantErr: OutcomeAdmissionRejected, wantBound: "gone", wantAdm: 1},
		{name: "concurrent winner is checked and returned", key: "k", winner: "w3", wantWorker: "w3", wantReason: "reuse", wantBound: "w3", wantAdm: 2, wantBinds: 1},
		{name: "concurrent winner rejected: AdmissionRejected, winner kept", key: "k", winner: "w3", reject: []string{"w3"}, wantErr: OutcomeAdmissionRejected, wantBound: "w3", wantAdm: 2, wantBinds: 1},
		{name: "concurrent winner on the same engine is reused as is", key: "k", winner: anyW, wantWorker: anyW, wantReason: "reuse", wantBound: anyW, wantAdm: 1, wantBinds: 1},
		{name: "concurrent winner outside the group is replaced", key: "k", winner: "gone", wantWorker: anyW, wantReason: "rebound", wantBound: anyW, wantAdm: 1, wantBinds: 2},
		// A store past its deadline (a host starved of CPU, a stuck scope actor) costs the
		// key its engine for this request, never the request.
		{name: "lookup past its deadline: the admitted fallback engine, binding kept", key: "k", bound: "w3", missed: "lookup", wantWorker: anyW, wantReason: ReasonStoreTimeout, wantBound: "w3", wantAdm: 1},
		{name: "lookup past its deadline, fallback engine rejected: AdmissionRejected", key: "k", bound: "w3", missed: "lookup", reject: []string{"w0", "w1", "w2", "w3"}, wantErr: OutcomeAdmissionRejected, wantBound: "w3", wantAdm: 1},
		{name: "bind past its deadline: the admitted fallback engine, unbound", key: "k", missed: "bind", wantWorker: anyW, wantReason: ReasonStoreTimeout, wantAdm: 1, wantBinds: 1},
		{name: "rebind past its deadline: the admitted fallback engine, old binding kept", key: "k", bound: "gone", missed: "bind", wantWorker: anyW, wantReason: ReasonStoreTimeout, wantBound: "gone", wantAdm: 1, wantBinds: 1},
	}
	for _, kind := range affinityKinds() {
		t.Run(kind.name, func(t *testing.T) {
			reasons := map[string]string{"noKey": kind.noKey, "reuse": kind.reuse, "rebound": kind.rebound, ReasonAssigned: ReasonAssigned, ReasonStoreTimeout: ReasonStoreTimeout}
			for _, tt := range tests {
				t.Run(tt.name, func(t *testing.T) {
					ws := testWorkers(t, "llama", StagePlain, "w", 4)
					ids := []string{"w0", "w1", "w2", "w3"}
					byName := map[string]*Worker{}
					for i, w := range ws {
						byName[ids[i]] = w
					}
					id := func(name string) string {
						if w := byName[name]; w != nil {
							return w.ID
						}
						return name
					}
					tab := loadTable(t, map[*Worker]load.RankReport{
						ws[0]: native(0, 0, 0, 0), ws[1]: native(1, 0, 10, 10), ws[2]: native(2, 0, 20, 20), ws[3]: native(60, 60, 60000, 90000),
					})
					store := newMemAffinity()
					scope := AffinityScope{Model: "llama", BucketID: "b", Stage: StagePlain}
					if tt.bound != "" {
						store.set(scope, tt.key, id(tt.bound))
					}
					missed := &PickError{Outcome: OutcomeTimeout, Stage: StagePlain, BucketID: "b", Detail: "affinity scope actor did not reply"}
					switch tt.missed {
					case "lookup":
						store.err = missed
					case "bind":
						store.bindErr = missed
					}
					if tt.winner != "" {
						staged := false
						store.beforeBind = func(m map[string]string, key, bindID string) {
							if !staged {
								staged = true
								m[key] = id(tt.winner)
								if tt.winner == anyW {
									m[key] = bindID // the concurrent request chose the same engine
								}
							}
						}
					}
					adm := &countingAdmission{reject: map[string]bool{}}
					for _, r := range tt.reject {
						adm.reject[id(r)] = true
					}
					p := kind.mk(adm, tab, store)
					got, err := p.Pick(ws, kind.keyReq(StagePlain, tt.key))

					if tt.wantErr != 0 {
						if OutcomeOf(err) != tt.wantErr {
							t.Fatalf("err = %v, want %v", err, tt.wantErr)
						}
					} else if err != nil {
						t.Fatalf("unexpected error %v", err)
					} else {
						if tt.wantWorker == anyW {
							if candidateByID(ws, got.Worker.ID) != got.Worker {
								t.Fatalf("picked %v outside the candidates", got.Worker)
							}
						} else if got.Worker.ID != id(tt.wantWorker) {
							t.Fatalf("picked %v, want %s", got.Worker, id(tt.wantWorker))
						}
						if got.Reason != reasons[tt.wantReason] {
							t.Fatalf("reason %q, want %q", got.Reason, reasons[tt.wantReason])
						}
					}
					wantBound := id(tt.wantBound)
					if tt.wantBound == anyW {
						wantBound = got.Worker.ID
					}
					if b := store.bound(scope, tt.key); b != wantBound {
						t.Fatalf("binding %q, want %q", b, wantBound)
					}
					if adm.calls != tt.wantAdm || store.binds != tt.wantBinds {
						t.Fatalf("admission calls %d (want %d), binds %d (want %d)", adm.calls, tt.wantAdm, store.binds, tt.wantBinds)
					}
					if tt.key == "" && store.lookups != 0 {
						t.Fatalf("a keyless pick looked up the store %d times", store.lookups)
					}
				})
			}
		})
	}
}

func TestAffinityScopesAreIndependent(t *testing.T) {
	for _, kind := range affinityKinds() {
		t.Run(kind.name, func(t *testing.T) {
			store := newMemAffinity()
			for _, stage := range []Stage{StagePrefill, StageDecode} {
				ws := testWorkers(t, "llama", stage, "w", 4)
				p := kind.mk(nil, nil, store)
				for _, bucketID := range []string{"a", "b"} {
					req := kind.keyReq(stage, "k")
					req.BucketID = bucketID
					got, err := p.Pick(ws, req)
					if err != nil || got.Reason != ReasonAssigned {
						t.Fatalf("%s/%s: first pick of the key in this scope = %v (%v), want assigned", bucketID, stage, got, err)
					}
					again, err := p.Pick(ws, req)
					if err != nil || again.Worker != got.Worker || again.Reason != kind.reuse {
						t.Fatalf("%s/%s: second pick = %v (%v), want %v reused", bucketID, stage, again, err, got.Worker)
					}
				}
			}
			if n := len(store.m); n != 4 {
				t.Fatalf("scopes = %d, want 4 (2 buckets x 2 stages)", n)
			}
			for sc := range store.m {
				if sc.Model != "llama" || (sc.BucketID != "a" && sc.BucketID != "b") {
					t.Fatalf("unexpected scope %v", sc)
				}
			}
		})
	}
}

// TestAffinityStoreFailures: a store failure other than a missed deadline (TestAffinityRules)
// fails the pick and stops the bucket loop.
func TestAffinityStoreFailures(t *testing.T) {
	tests := []struct {
		name string
		err  error
		want Outcome
	}{
		{"overloaded store", &PickError{Outcome: OutcomeOverloaded, Detail: "affinity scope mailbox is full"}, OutcomeOverloaded},
		{"anything else is internal", errors.New("boom"), OutcomeInternal},
		{"a wrapped internal failure stays internal", fmt.Errorf("cannot look up binding: %w", ErrInternal), OutcomeInternal},
	}
	for _, kind := range affinityKinds() {
		for _, tt := range tests {
			t.Run(kind.name+"/"+tt.name, func(t *testing.T) {
				store := newMemAffinity()
				store.err = tt.err
				ws := testWorkers(t, "llama", StageDecode, "w", 3)
				_, err := kind.mk(nil, nil, store).Pick(ws, kind.keyReq(StageDecode, "k"))
				var pe *PickError
				if !errors.As(err, &pe) || pe.Outcome != tt.want || pe.Stage != StageDecode || pe.BucketID != "b" || pe.Advances() {
					t.Fatalf("err = %v, want %v in bucket b stage decode that stops the loop", err, tt.want)
				}
				// Keyless requests never touch the store.
				if _, err := kind.mk(nil, nil, store).Pick(ws, kind.keyReq(StageDecode, "")); err != nil {
					t.Fatalf("keyless pick with a failing store: %v", err)
				}
			})
		}
	}
}

func TestAffinityWithoutStoreIsMisconfigured(t *testing.T) {
	for _, kind := range affinityKinds() {
		t.Run(kind.name, func(t *testing.T) {
			ws := testWorkers(t, "llama", StagePlain, "w", 2)
			_, err := kind.mk(nil, nil, nil).Pick(ws, kind.keyReq(StagePlain, "k"))
			if !errors.Is(err, ErrInvalidConfiguration) {
				t.Fatalf("err = %v", err)
			}
		})
	}
}

// TestAffinityFallbackOutsideCandidates: a fallback returning a foreign engine (even with a
// candidate's ID) is refused before anything is bound.
func TestAffinityFallbackOutsideCandidates(t *testing.T) {
	ws := testWorkers(t, "llama", StagePlain, "w", 3)
	impostor := NewWorker(ws[1].ID, ws[1].URL, "llama", StagePlain, nil)
	store := newMemAffinity()
	fb := &fixedPolicy{fn: func([]*Worker, *PickRequest) (Pick, error) { return Pick{Worker: impostor, Reason: "x"}, nil }}
	p := NewSticky(nil, nil, store, fb)
	req := pickReq(StagePlain)
	req.RoutingKey = "k"
	if _, err := p.Pick(ws, req); !errors.Is(err, ErrOutsideCandidates) {
		t.Fatalf("err = %v", err)
	}
	if store.binds != 0 {
		t.Fatalf("bound a foreign engine")
	}
}

// TestAffinityPDDecodeFailureKeepsPrefillBinding: a binding records placement, not dispatch.
// When the decode group of the same bucket rejects, the prefill binding made by this attempt
// stays, and the session returns to its prefill engine once decode admits again.
func TestAffinityPDDecodeFailureKeepsPrefillBinding(t *testing.T) {
	for _, kind := range affinityKinds() {
		t.Run(kind.name, func(t *testing.T) {
			pw := testWorkers(t, "llama", StagePrefill, "p", 4)
			dw := testWorkers(t, "llama", StageDecode, "d", 2)
			next := testWorkers(t, "llama", StageDecode, "n", 1)
			set := mustSet(t, pw, dw, next)
			store := newMemAffinity()
			decodeAdm := rejectIDs{}
			for _, w := range dw {
				decodeAdm[w.ID] = true
			}
			short := bucket("short", 10, 0, 4096, 8192)
			short.Prefill = NewEngineGroup("llama", StagePrefill, nil, kind.mk(nil, nil, store))
			short.Decode = NewEngineGroup("llama", StageDecode, []string{dw[0].ID, dw[1].ID}, NewRoundRobin(decodeAdm, nil))
			long := bucket("long", 20, 0, 131072, 131072)
			long.Prefill = NewEngineGroup("llama", StagePrefill, nil, kind.mk(nil, nil, store))
			long.Decode = NewEngineGroup("llama", StageDecode, []string{next[0].ID}, NewRoundRobin(nil, nil))

			req := breq("llama", 100, -1)
			req.Now = t0
			kind.withKey(req, "sess-1")
			var tried []string
			pick, err := selectEngines([]*Bucket{short, long}, req, func(b *Bucket) (BucketPick, error) {
				tried = append(tried, b.ID)
				return pickEngines(b, set.Load(), req)
			})
			if err != nil || pick.BucketID != "long" || len(tried) != 2 {
				t.Fatalf("pick %+v err %v tried %v: want the long bucket after short's decode rejection", pick, err, tried)
			}
			shortScope := AffinityScope{Model: "llama", BucketID: "short", Stage: StagePrefill}
			bound := store.bound(shortScope, "sess-1")
			if bound == "" {
				t.Fatal("the short bucket's prefill binding was dropped after its decode group failed")
			}
			if store.bound(AffinityScope{Model: "llama", BucketID: "long", Stage: StagePrefill}, "sess-1") != pick.Prefill.Worker.ID {
				t.Fatal("the long bucket's prefill pick is not bound")
			}
			// Decode admits again: the short bucket serves the session on its bound prefill engine.
			clear(decodeAdm)
			got, err := pickEngines(short, set.Load(), req)
			if err != nil || got.Prefill.Worker.ID != bound || got.Prefill.Reason != kind.reuse {
				t.Fatalf("got %+v err %v, want prefill %s reused", got, err, bound)
			}
		})
	}
}

func TestAffinityLongKeysAreDigested(t *testing.T) {
	for _, kind := range affinityKinds() {
		t.Run(kind.name, func(t *testing.T) {
			ws := testWorkers(t, "llama", StagePlain, "w", 8)
			store := newMemAffinity()
			p := kind.mk(nil, nil, store)
			common := strings.Repeat("x", 4000)
			short := strings.Repeat("y", MaxAffinityKeyBytes)
			for _, key := range []string{common + "a", common + "b", short} {
				first, err := p.Pick(ws, kind.keyReq(StagePlain, key))
				if err != nil || first.Reason != ReasonAssigned {
					t.Fatalf("first pick: %v (%v), want a new binding per distinct key", first, err)
				}
				again, err := p.Pick(ws, kind.keyReq(StagePlain, key))
				if err != nil || again.Worker != first.Worker || again.Reason != kind.reuse {
					t.Fatalf("second pick: %v (%v), want %v reused", again, err, first.Worker)
				}
			}
			scope := AffinityScope{Model: "llama", BucketID: "b", Stage: StagePlain}
			if n := len(store.m[scope]); n != 3 {
				t.Fatalf("%d bindings, want 3", n)
			}
			for k := range store.m[scope] {
				if len(k) > MaxAffinityKeyBytes && !strings.HasPrefix(k, digestPrefix) {
					t.Fatalf("stored a %d-byte key as is", len(k))
				}
			}
			if store.bound(scope, short) == "" {
				t.Fatal("a key of exactly the limit must be stored as is")
			}
		})
	}
}
