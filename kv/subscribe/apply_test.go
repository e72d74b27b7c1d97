package subscribe

import (
	"bytes"
	"errors"
	"log/slog"
	"testing"

	"switchyard/kv/events"
	"switchyard/kv/hashing"
	"switchyard/kv/index"
	"switchyard/kv/internal/kvtest"
	"switchyard/load"
)

func TestSeqTracker(t *testing.T) {
	tests := []struct {
		name   string
		known  bool
		last   uint64
		dedupe bool
		seq    uint64
		want   seqVerdict
	}{
		{"first message at any seq", false, 0, false, 41, seqNext},
		{"the next one", true, 41, false, 42, seqNext},
		{"a gap", true, 41, false, 44, seqGap},
		{"back to zero is a restart", true, 41, false, 0, seqRestart},
		{"a repeat is a restart", true, 41, false, 41, seqRestart},
		{"after a replay, covered seqs are duplicates", true, 41, true, 40, seqDuplicate},
		{"after a replay, the next is next", true, 41, true, 42, seqNext},
		{"after a replay, a seq below the replayed range is a restart", true, 41, true, 0, seqRestart},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tr := seqTracker{known: tt.known, last: tt.last}
			if tt.dedupe {
				tr.replayed(38)
			}
			if got := tr.observe(tt.seq); got != tt.want {
				t.Fatalf("observe(%d) = %d, want %d", tt.seq, got, tt.want)
			}
		})
	}
}

// engineHashes are hashes a vLLM-style engine might publish: not the router's.
func engineHashes(base int64, n int) []int64 {
	out := make([]int64, n)
	for i := range out {
		out[i] = base*1_000_003 + int64(i)*7919 + 17
	}
	return out
}

func stored(hashes []int64, parent int64, tokens []uint32, bs int, medium events.Medium) events.Event {
	return events.Event{Kind: events.EventBlockStored, BlockHashes: hashes, ParentHash: parent, HasParent: parent != 0,
		TokenIDs: tokens, BlockSize: bs, Medium: medium}
}

func newTestApplier(t *testing.T, x *index.Index, worker string, rekey bool) *applier {
	t.Helper()
	scheme := HashSchemeAuto
	if rekey {
		scheme = HashSchemeRekey
	}
	return newApplier(x, worker, scheme, slog.New(slog.DiscardHandler), load.LogThrottle{})
}

func applyEvents(t *testing.T, a *applier, rank int, evs ...events.Event) {
	t.Helper()
	if err := a.apply(&events.EventBatch{Events: evs}, rank); err != nil {
		t.Fatal(err)
	}
}

func TestApplierVerifiesRouterHashes(t *testing.T) {
	x := kvtest.NewIndex(t, 4, 1<<16)
	kvtest.Register(t, x, "a", 1, 16)
	a := newTestApplier(t, x, "a", false)
	prompt := kvtest.SeqTokens(0, 256)
	hs := hashing.AppendBlockHashes(nil, prompt, 16)
	applyEvents(t, a, 0,
		stored(hs[:8], 0, prompt[:128], 16, events.MediumGPU),
		stored(hs[8:], hs[7], prompt[128:], 16, events.MediumNone))
	if !a.verified || a.rekey {
		t.Fatalf("verified %v rekey %v", a.verified, a.rekey)
	}
	if got := kvtest.Lookup(t, x, "m", prompt); got["a"] != 256 {
		t.Fatalf("got %v", got)
	}
	applyEvents(t, a, 0, events.Event{Kind: events.EventBlockRemoved, BlockHashes: hs[4:5]})
	if got := kvtest.Lookup(t, x, "m", prompt); got["a"] != 64 {
		t.Fatalf("after remove: %v", got)
	}
}

func TestApplierRekeysUnreproducibleHashes(t *testing.T) {
	x := kvtest.NewIndex(t, 4, 1<<16)
	kvtest.Register(t, x, "v", 1, 16)
	a := newTestApplier(t, x, "v", false)
	prompt := kvtest.SeqTokens(1<<31, 320) // token IDs above 2^31, as simulated tokenizers emit
	eh := engineHashes(1, 20)
	// A block published before the first root block, with a parent (the router joined
	// late), is not keyed by the engine's hash: nothing proves it the router's.
	applyEvents(t, a, 0, stored(engineHashes(9, 1), 99, kvtest.SeqTokens(5, 16), 16, events.MediumGPU))
	if n := x.Stats().Blocks; n != 0 {
		t.Fatalf("%d blocks indexed under an unverified engine hash", n)
	}
	applyEvents(t, a, 0,
		stored(eh[:10], 0, prompt[:160], 16, events.MediumGPU), // root: hash differs → re-key
		stored(eh[10:], eh[9], prompt[160:], 16, events.MediumGPU))
	if !a.rekey || a.verified {
		t.Fatalf("rekey %v verified %v", a.rekey, a.verified)
	}
	if got := kvtest.Lookup(t, x, "m", prompt); got["v"] != 320 {
		t.Fatalf("got %v", got)
	}
	if st := x.Stats(); st.Blocks != 20 {
		x.Prune()
		if st = x.Stats(); st.Blocks != 20 {
			t.Fatalf("blocks %d, want the 20 re-keyed ones", st.Blocks)
		}
	}
	// A remove names engine hashes; it is translated.
	applyEvents(t, a, 0, events.Event{Kind: events.EventBlockRemoved, BlockHashes: eh[12:13], Medium: events.MediumGPU})
	if got := kvtest.Lookup(t, x, "m", prompt); got["v"] != 192 {
		t.Fatalf("after remove: %v", got)
	}
	// A store whose parent was never seen cannot be keyed: dropped, counted.
	before := x.Metrics().Ingest().OpsDroppedUnkeyed
	applyEvents(t, a, 0, stored(engineHashes(3, 2), 424242, kvtest.SeqTokens(9000, 32), 16, events.MediumGPU))
	if got := x.Metrics().Ingest().OpsDroppedUnkeyed - before; got != 2 {
		t.Fatalf("dropped %d", got)
	}
	if c := x.Metrics().Ingest(); c.HashMismatches != 1 || c.ClearsRekey != 0 || c.OpsDroppedUnkeyed != 3 {
		t.Fatalf("counts %+v", c)
	}
}

func TestApplierClearsAndBlockSize(t *testing.T) {
	x := kvtest.NewIndex(t, 2, 1<<16)
	ids := kvtest.Register(t, x, "a", 2, 16)
	a := newTestApplier(t, x, "a", true)
	prompt := kvtest.SeqTokens(0, 256)
	t.Run("a cleared-then-stored batch keeps what follows the clear", func(t *testing.T) {
		eh := engineHashes(2, 4)
		applyEvents(t, a, 1,
			stored(eh[:2], 0, prompt[:32], 16, events.MediumGPU),
			events.Event{Kind: events.EventAllBlocksCleared},
			stored(eh[2:3], 0, prompt[:16], 16, events.MediumGPU))
		if got := kvtest.Lookup(t, x, "m", prompt); got["a"] != 16 {
			t.Fatalf("got %v", got)
		}
	})
	t.Run("the batch's DP rank wins; an unseen rank is learned", func(t *testing.T) {
		applyEvents(t, a, 0) // rank 0 still known
		if err := a.apply(&events.EventBatch{HasDPRank: true, DPRank: 5, Events: []events.Event{stored(engineHashes(9, 1), 0, prompt[:16], 16, events.MediumGPU)}}, 0); err != nil {
			t.Fatalf("rank 5 of a worker registered with 2: %v", err)
		}
		id5, ok := x.Owners().Lookup("a", 5)
		if !ok || x.Owners().Info(id5).Rank != 5 {
			t.Fatal("rank 5 not registered")
		}
		if got := kvtest.Lookup(t, x, "m", prompt); got["a"] != 16 {
			t.Fatalf("rank 1's entries lost, or rank 5's not indexed: %v", got)
		}
		err := a.apply(&events.EventBatch{HasDPRank: true, DPRank: maxDPRanks, Events: []events.Event{{Kind: events.EventAllBlocksCleared}}}, 0)
		if err == nil {
			t.Fatalf("rank %d accepted", maxDPRanks)
		}
	})
	t.Run("a published block size replaces the default", func(t *testing.T) {
		eh := engineHashes(3, 2)
		applyEvents(t, a, 0, stored(eh, 0, prompt[:128], 64, events.MediumGPU))
		if bs := x.Owners().Info(ids[0]).BlockSize; bs != 64 {
			t.Fatalf("block size %d", bs)
		}
		if got := kvtest.Lookup(t, x, "m", prompt); got["a"] != 128 {
			t.Fatalf("got %v", got)
		}
	})
}

// TestIngestorDecodesTokenIDsWhileNeeded: an engine's batches are decoded with their token IDs
// until its hashes are known to be the router's, and always for an engine re-keyed from them;
// once verified, its batches are decoded without them (events.Decoder.SkipTokenIDs), which
// still refuses a malformed token list.
func TestIngestorDecodesTokenIDsWhileNeeded(t *testing.T) {
	x := kvtest.NewIndex(t, 4, 1<<16)
	kvtest.Register(t, x, "s", 1, 16)
	kvtest.Register(t, x, "v", 1, 16)
	prompt := kvtest.SeqTokens(1<<31, 320)
	rh := hashing.AppendBlockHashes(nil, prompt, 16)
	eh := engineHashes(1, 20)
	encode := func(evs ...events.Event) []byte {
		p, err := events.AppendEventBatch(nil, &events.EventBatch{Events: evs}, events.ShapeArray)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	sg, vl := NewIngestor(x, "s", false, nil), NewIngestor(x, "v", false, nil)
	for _, step := range []struct {
		ing     *Ingestor
		payload []byte
	}{
		{sg, encode(stored(rh[:10], 0, prompt[:160], 16, events.MediumGPU))},
		{sg, encode(stored(rh[10:], rh[9], prompt[160:], 16, events.MediumGPU))},
		{vl, encode(stored(eh[:10], 0, prompt[:160], 16, events.MediumGPU))},
		{vl, encode(stored(eh[10:], eh[9], prompt[160:], 16, events.MediumGPU))},
	} {
		if _, err := step.ing.Apply(step.payload, 0); err != nil {
			t.Fatal(err)
		}
	}
	if !sg.ap.verified || sg.ap.needsTokens() || !vl.ap.rekey || !vl.ap.needsTokens() {
		t.Fatalf("sglang verified %t, needs tokens %t; vllm rekey %t, needs tokens %t",
			sg.ap.verified, sg.ap.needsTokens(), vl.ap.rekey, vl.ap.needsTokens())
	}
	if got := kvtest.Lookup(t, x, "m", prompt); got["s"] != 320 || got["v"] != 320 {
		t.Fatalf("lookup %v, want both engines holding all 320 tokens", got)
	}
	// A verified engine's batch with a negative token ID is still refused, and changes nothing.
	bad := encode(stored(rh[:1], 0, []uint32{1, 2}, 16, events.MediumGPU))
	i := bytes.LastIndex(bad, []byte{0x92, 0x01, 0x02})
	if i < 0 {
		t.Fatalf("token list not found in % x", bad)
	}
	bad[i+2] = 0xff // -1
	if _, err := sg.Apply(bad, 0); !errors.Is(err, events.ErrMalformed) {
		t.Fatalf("err = %v, want ErrMalformed", err)
	}
}
