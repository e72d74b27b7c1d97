package events

import (
	"bytes"
	"errors"
	"math"
	"reflect"
	"slices"
	"testing"

	"github.com/vmihailenco/msgpack/v5"
)

// sampleBatches covers every event kind and every optional field the encoder can emit.
func sampleBatches() map[string]*EventBatch {
	tokens := make([]uint32, 32)
	for i := range tokens {
		tokens[i] = uint32(i) * 134217757 // spans the whole uint32 range
	}
	return map[string]*EventBatch{
		"stored first block": {TS: 1795969854.43, DPRank: 0, HasDPRank: true, Events: []Event{{
			Kind: EventBlockStored, BlockHashes: []int64{7094107071823868517, -1}, TokenIDs: tokens,
			BlockSize: 16, Medium: MediumGPU,
		}}},
		"stored with parent and lora": {TS: 12.5, Events: []Event{{
			Kind: EventBlockStored, BlockHashes: []int64{math.MinInt64}, ParentHash: math.MaxInt64, HasParent: true,
			TokenIDs: tokens[:16], BlockSize: 16, LoRAID: 3, HasLoRA: true,
		}}},
		"removed per tier": {TS: 1, DPRank: 7, HasDPRank: true, Events: []Event{
			{Kind: EventBlockRemoved, BlockHashes: []int64{1, 2, 3}},
			{Kind: EventBlockRemoved, BlockHashes: []int64{4}, Medium: MediumCPUPinned},
			{Kind: EventBlockRemoved, BlockHashes: []int64{5}, Medium: MediumDisk},
			{Kind: EventBlockRemoved, BlockHashes: []int64{6}, Medium: MediumExternal},
		}},
		"cleared": {TS: 2, Events: []Event{{Kind: EventAllBlocksCleared}}},
		"empty":   {TS: 3, Events: []Event{}},
		"mixed": {TS: 4, HasDPRank: true, DPRank: 1, Events: []Event{
			{Kind: EventAllBlocksCleared},
			{Kind: EventBlockStored, BlockHashes: []int64{10, 11}, TokenIDs: tokens[:8], BlockSize: 4, Medium: MediumGPU},
			{Kind: EventBlockStored, BlockHashes: []int64{12}, ParentHash: 11, HasParent: true, TokenIDs: tokens[8:12], BlockSize: 4, Medium: MediumGPU},
			{Kind: EventBlockRemoved, BlockHashes: []int64{12, 11}, Medium: MediumGPU},
		}},
	}
}

// normalize makes decoded and expected batches comparable: empty slices as nil.
func normalize(b *EventBatch) *EventBatch {
	out := *b
	out.Events = nil
	for _, ev := range b.Events {
		if len(ev.BlockHashes) == 0 {
			ev.BlockHashes = nil
		}
		if len(ev.TokenIDs) == 0 {
			ev.TokenIDs = nil
		}
		out.Events = append(out.Events, ev)
	}
	return &out
}

func TestEventRoundTrip(t *testing.T) {
	for name, b := range sampleBatches() {
		for _, shape := range []Shape{ShapeArray, ShapeMap} {
			t.Run(name+"/"+shape.String(), func(t *testing.T) {
				payload, err := AppendEventBatch(nil, b, shape)
				if err != nil {
					t.Fatal(err)
				}
				got, err := DecodeEventBatch(payload)
				if err != nil {
					t.Fatal(err)
				}
				if !reflect.DeepEqual(normalize(got), normalize(b)) {
					t.Fatalf("round trip:\n got %+v\nwant %+v", normalize(got), normalize(b))
				}
			})
		}
	}
}

// TestEventWireShapes checks the encoding against an independent msgpack decoder.
func TestEventWireShapes(t *testing.T) {
	b := &EventBatch{TS: 1.5, HasDPRank: true, DPRank: 2, Events: []Event{
		{Kind: EventBlockStored, BlockHashes: []int64{-5}, TokenIDs: []uint32{4000000000}, BlockSize: 1, Medium: MediumGPU},
		{Kind: EventBlockRemoved, BlockHashes: []int64{-5}},
		{Kind: EventAllBlocksCleared},
	}}
	tests := []struct {
		shape Shape
		want  []any
	}{
		{ShapeArray, []any{1.5, []any{
			[]any{"BlockStored", []any{int64(-5)}, nil, []any{uint64(4000000000)}, int64(1), nil, "GPU"},
			[]any{"BlockRemoved", []any{int64(-5)}},
			[]any{"AllBlocksCleared"},
		}, int64(2)}},
		{ShapeMap, []any{1.5, []any{
			map[string]any{"type": "BlockStored", "block_hashes": []any{int64(-5)}, "parent_block_hash": nil,
				"token_ids": []any{uint64(4000000000)}, "block_size": int64(1), "lora_id": nil, "medium": "GPU"},
			map[string]any{"type": "BlockRemoved", "block_hashes": []any{int64(-5)}},
			map[string]any{"type": "AllBlocksCleared"},
		}, int64(2)}},
	}
	for _, tt := range tests {
		t.Run(tt.shape.String(), func(t *testing.T) {
			payload, err := AppendEventBatch(nil, b, tt.shape)
			if err != nil {
				t.Fatal(err)
			}
			dec := msgpack.NewDecoder(bytes.NewReader(payload))
			var got any
			dec.UseLooseInterfaceDecoding(true)
			if err := dec.Decode(&got); err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, any(tt.want)) {
				t.Fatalf("wire form:\n got %#v\nwant %#v", got, tt.want)
			}
		})
	}
}

func mustMarshal(t testing.TB, v any) []byte {
	t.Helper()
	b, err := msgpack.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// vllmExample is INTEROP.md's vLLM payload.
func vllmExample() []any {
	ids := make([]any, 16)
	for i := range ids {
		ids[i] = uint32(3801292497 + i)
	}
	return []any{1795969854.43, []any{[]any{"BlockStored", []any{int64(7094107071823868517)}, 0, ids, 16, nil, "GPU", nil, nil}}, 0}
}

func TestDecodeAccepts(t *testing.T) {
	ids := func(n int) []uint32 {
		out := make([]uint32, n)
		for i := range out {
			out[i] = uint32(3801292497 + i)
		}
		return out
	}
	tests := []struct {
		name string
		in   any
		want *EventBatch
	}{
		{"interop vllm example", vllmExample(), &EventBatch{TS: 1795969854.43, HasDPRank: true, Events: []Event{{
			Kind: EventBlockStored, BlockHashes: []int64{7094107071823868517}, TokenIDs: ids(16), BlockSize: 16, Medium: MediumGPU,
		}}}},
		{"no rank, no lora, no medium", []any{1, []any{[]any{"BlockStored", []int64{1}, nil, []int{5}, 1}}},
			&EventBatch{TS: 1, Events: []Event{{Kind: EventBlockStored, BlockHashes: []int64{1}, TokenIDs: []uint32{5}, BlockSize: 1}}}},
		{"null rank", []any{1, []any{}, nil}, &EventBatch{TS: 1}},
		{"map with unknown keys", []any{2.0, []any{map[string]any{
			"type": "BlockStored", "block_hashes": []int64{9}, "parent_block_hash": int64(8), "token_ids": []uint32{1, 2},
			"block_size": 2, "lora_id": "adapter-a", "medium": "CPU_PINNED", "cache_salt": "s", "session_id": map[string]any{"x": []any{1}},
		}}}, &EventBatch{TS: 2, Events: []Event{{Kind: EventBlockStored, BlockHashes: []int64{9}, ParentHash: 8, HasParent: true,
			TokenIDs: []uint32{1, 2}, BlockSize: 2, Medium: MediumCPUPinned}}}},
		{"removed extra elements", []any{1, []any{[]any{"BlockRemoved", []int64{3}, "GPU", "extra", []any{1, 2}}}},
			&EventBatch{TS: 1, Events: []Event{{Kind: EventBlockRemoved, BlockHashes: []int64{3}, Medium: MediumGPU}}}},
		{"unknown medium", []any{1, []any{[]any{"BlockRemoved", []int64{3}, "NVME"}}},
			&EventBatch{TS: 1, Events: []Event{{Kind: EventBlockRemoved, BlockHashes: []int64{3}, Medium: MediumOther}}}},
		{"unknown event skipped", []any{1, []any{[]any{"BlockMoved", 1, 2}, map[string]any{"type": "Other", "block_hashes": []int{1}}, []any{"AllBlocksCleared"}}},
			&EventBatch{TS: 1, Skipped: 2, Events: []Event{{Kind: EventAllBlocksCleared}}}},
		{"bytes hashes", []any{1, []any{[]any{"BlockRemoved", []any{[]byte{0, 0, 0, 0, 0, 0, 1, 0}, []byte("abc")}}}},
			&EventBatch{TS: 1, Events: []Event{{Kind: EventBlockRemoved, BlockHashes: []int64{256, bytesHash([]byte("abc"))}}}}},
		{"uint64 hash wraps", []any{1, []any{[]any{"BlockRemoved", []any{uint64(math.MaxUint64)}}}},
			&EventBatch{TS: 1, Events: []Event{{Kind: EventBlockRemoved, BlockHashes: []int64{-1}}}}},
		{"map batch", map[string]any{"ts": 5, "events": []any{[]any{"AllBlocksCleared"}}, "data_parallel_rank": 3, "extra": 1},
			&EventBatch{TS: 5, DPRank: 3, HasDPRank: true, Events: []Event{{Kind: EventAllBlocksCleared}}}},
		{"float32 ts", []any{float32(0.5), []any{}}, &EventBatch{TS: 0.5}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := DecodeEventBatch(mustMarshal(t, tt.in))
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(normalize(got), normalize(tt.want)) {
				t.Fatalf("\n got %+v\nwant %+v", normalize(got), normalize(tt.want))
			}
		})
	}
}

func TestDecodeRejects(t *testing.T) {
	nested := any([]any{})
	for range 100 {
		nested = []any{nested}
	}
	tests := []struct {
		name    string
		in      any
		raw     []byte
		wantErr error
	}{
		{name: "not an array", in: "x", wantErr: ErrMalformed},
		{name: "short batch", in: []any{1.0}, wantErr: ErrMalformed},
		{name: "events not a list", in: []any{1.0, 5}, wantErr: ErrMalformed},
		{name: "short stored", in: []any{1, []any{[]any{"BlockStored", []int{1}, nil, []int{1}}}}, wantErr: ErrMalformed},
		{name: "negative token", in: []any{1, []any{[]any{"BlockStored", []int{1}, nil, []int{-1}, 1}}}, wantErr: ErrMalformed},
		{name: "token above uint32", in: []any{1, []any{[]any{"BlockStored", []int{1}, nil, []int64{1 << 32}, 1}}}, wantErr: ErrMalformed},
		{name: "too many hashes", in: []any{1, []any{[]any{"BlockRemoved", make([]int64, MaxHashesPerEvent+1)}}}, wantErr: ErrTooLarge},
		{name: "too many tokens", in: []any{1, []any{[]any{"BlockStored", []int{1}, nil, make([]uint32, MaxTokensPerEvent+1), 1}}}, wantErr: ErrTooLarge},
		{name: "map without type", in: []any{1, []any{map[string]any{"block_hashes": []int{1}}}}, wantErr: ErrMalformed},
		{name: "stored map without hashes", in: []any{1, []any{map[string]any{"type": "BlockStored"}}}, wantErr: ErrMalformed},
		{name: "deep nesting in unknown key", in: []any{1, []any{map[string]any{"type": "AllBlocksCleared", "x": nested}}}, wantErr: ErrMalformed},
		{name: "trailing bytes", raw: append(mustMarshal(t, []any{1, []any{}}), 0xc0), wantErr: ErrMalformed},
		{name: "huge array header", raw: []byte{0x92, 0x01, 0xdd, 0xff, 0xff, 0xff, 0xff}, wantErr: ErrMalformed},
		{name: "invalid code", raw: []byte{0x92, 0x01, 0x91, 0xc1}, wantErr: ErrMalformed},
		{name: "negative rank", in: []any{1, []any{}, -1}, wantErr: ErrMalformed},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			raw := tt.raw
			if raw == nil {
				raw = mustMarshal(t, tt.in)
			}
			_, err := DecodeEventBatch(raw)
			if !errors.Is(err, tt.wantErr) || !errors.Is(err, ErrMalformed) {
				t.Fatalf("err = %v, want %v", err, tt.wantErr)
			}
		})
	}
}

func TestDecodeTruncated(t *testing.T) {
	for name, b := range sampleBatches() {
		for _, shape := range []Shape{ShapeArray, ShapeMap} {
			payload, err := AppendEventBatch(nil, b, shape)
			if err != nil {
				t.Fatal(err)
			}
			var d Decoder
			var out EventBatch
			for n := range len(payload) {
				if err := d.Decode(payload[:n], &out); !errors.Is(err, ErrMalformed) {
					t.Fatalf("%s/%s: prefix of %d bytes: err = %v, want ErrMalformed", name, shape, n, err)
				}
			}
		}
	}
}

func TestDecoderReuse(t *testing.T) {
	var d Decoder
	var b EventBatch
	bs := sampleBatches()
	for _, name := range []string{"mixed", "removed per tier", "stored first block", "mixed"} {
		payload, err := AppendEventBatch(nil, bs[name], ShapeArray)
		if err != nil {
			t.Fatal(err)
		}
		if err := d.Decode(payload, &b); err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(normalize(&b), normalize(bs[name])) {
			t.Fatalf("%s: reused decoder gave %+v", name, b)
		}
	}
}

func TestParseShapeAndMedium(t *testing.T) {
	for _, s := range []Shape{ShapeArray, ShapeMap} {
		got, err := ParseShape(s.String())
		if err != nil || got != s {
			t.Errorf("ParseShape(%q) = %v, %v", s, got, err)
		}
	}
	if _, err := ParseShape("tuple"); err == nil {
		t.Error("ParseShape(tuple) succeeded")
	}
	for _, m := range []Medium{MediumGPU, MediumCPUPinned, MediumDisk, MediumExternal, MediumOther} {
		if got := ParseMedium(m.String()); got != m {
			t.Errorf("ParseMedium(%q) = %v", m, got)
		}
	}
}

func FuzzDecodeEventBatch(f *testing.F) {
	f.Add(mustMarshal(f, vllmExample()))
	for _, b := range sampleBatches() {
		for _, shape := range []Shape{ShapeArray, ShapeMap} {
			p, err := AppendEventBatch(nil, b, shape)
			if err != nil {
				f.Fatal(err)
			}
			f.Add(p)
		}
	}
	var d Decoder
	skip := Decoder{SkipTokenIDs: true}
	f.Fuzz(func(t *testing.T, payload []byte) {
		var b, sb EventBatch
		err := d.Decode(payload, &b)
		// Skipping token IDs refuses what keeping them refuses, and decodes the rest alike.
		if serr := skip.Decode(payload, &sb); (serr == nil) != (err == nil) {
			t.Fatalf("keeping token IDs: %v; skipping them: %v", err, serr)
		} else if err == nil {
			kept := *normalize(&b)
			kept.Events = slices.Clone(kept.Events)
			for i := range kept.Events {
				kept.Events[i].TokenIDs = nil
			}
			g := normalize(&sb)
			if math.IsNaN(g.TS) && math.IsNaN(kept.TS) {
				g.TS, kept.TS = 0, 0 // NaN is not equal to itself
			}
			if !reflect.DeepEqual(g, &kept) {
				t.Fatalf("skipping token IDs:\n got %+v\nwant %+v", g, &kept)
			}
		}
		if err != nil {
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("error does not wrap ErrMalformed: %v", err)
			}
			return
		}
		// What decodes re-encodes in both shapes to the same batch (minus skipped events).
		want := normalize(&b)
		want.Skipped = 0
		if math.IsNaN(want.TS) {
			want.TS = 0
		}
		for _, shape := range []Shape{ShapeArray, ShapeMap} {
			p, err := AppendEventBatch(nil, &b, shape)
			if err != nil {
				t.Fatalf("re-encode %s: %v", shape, err)
			}
			got, err := DecodeEventBatch(p)
			if err != nil {
				t.Fatalf("decode re-encoded %s: %v", shape, err)
			}
			if math.IsNaN(got.TS) {
				got.TS = 0
			}
			if g := normalize(got); !reflect.DeepEqual(g, want) {
				t.Fatalf("%s round trip:\n got %+v\nwant %+v", shape, g, want)
			}
		}
	})
}

// TestDecodeEveryIntegerEncoding: token IDs and block hashes in every msgpack integer
// encoding, mixed in one list (the decoder reads the common ones in a loop of its own and
// the others one by one), and each list cut off inside a value.
func TestDecodeEveryIntegerEncoding(t *testing.T) {
	type enc struct {
		raw []byte
		v   int64
	}
	ints := []enc{
		{[]byte{0x05}, 5},
		{[]byte{0xcc, 0xc8}, 200},
		{[]byte{0xcd, 0x12, 0x34}, 0x1234},
		{[]byte{0xce, 0xf0, 0x00, 0x00, 0x01}, 0xf0000001},
		{[]byte{0xcf, 0, 0, 0, 0, 0, 0, 0, 0x07}, 7},
		{[]byte{0xd0, 0x05}, 5},
		{[]byte{0xd1, 0x01, 0x00}, 256},
		{[]byte{0xd2, 0x00, 0x01, 0x00, 0x00}, 65536},
		{[]byte{0xd3, 0, 0, 0, 0, 0, 0, 0x01, 0x00}, 256},
	}
	hashOnly := []enc{
		{[]byte{0xcf, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xfe}, -2},
		{[]byte{0xd3, 0x80, 0, 0, 0, 0, 0, 0, 0}, math.MinInt64},
		{[]byte{0xff}, -1},
		{[]byte{0xd0, 0x80}, -128},
		{[]byte{0xc4, 0x08, 0, 0, 0, 0, 0, 0, 0x01, 0x02}, 258},
	}
	list := func(es []enc) (raw []byte, want []int64) {
		raw = []byte{0xdc, byte(len(es) >> 8), byte(len(es))}
		for _, e := range es {
			raw = append(raw, e.raw...)
			want = append(want, e.v)
		}
		return raw, want
	}
	// Each encoding after each other one: a run of common ones, then a slow one, and back.
	var tokens, hashes []enc
	for _, a := range ints {
		for _, b := range ints {
			tokens = append(tokens, a, b)
		}
	}
	for _, a := range append(ints, hashOnly...) {
		for _, b := range append(ints, hashOnly...) {
			hashes = append(hashes, a, b)
		}
	}
	hs, wantH := list(hashes)
	ts, wantT := list(tokens)
	payload := []byte{0x92, 0x01, 0x91, 0x95, 0xab}
	payload = append(payload, "BlockStored"...)
	payload = append(payload, hs...)
	payload = append(payload, 0xc0)
	payload = append(payload, ts...)
	payload = append(payload, 0x10)
	var d Decoder
	var b EventBatch
	if err := d.Decode(payload, &b); err != nil {
		t.Fatal(err)
	}
	ev := b.Events[0]
	if !slices.Equal(ev.BlockHashes, wantH) {
		t.Fatalf("hashes\n got %v\nwant %v", ev.BlockHashes, wantH)
	}
	gotT := make([]int64, len(ev.TokenIDs))
	for i, v := range ev.TokenIDs {
		gotT[i] = int64(v)
	}
	if !slices.Equal(gotT, wantT) {
		t.Fatalf("tokens\n got %v\nwant %v", gotT, wantT)
	}
	skip := Decoder{SkipTokenIDs: true}
	if err := skip.Decode(payload, &b); err != nil || len(b.Events[0].TokenIDs) != 0 || !slices.Equal(b.Events[0].BlockHashes, wantH) {
		t.Fatalf("skipping token IDs: err %v, %d token IDs kept, hashes equal %t", err, len(b.Events[0].TokenIDs), slices.Equal(b.Events[0].BlockHashes, wantH))
	}
	for n := range len(payload) {
		if err := d.Decode(payload[:n], &b); !errors.Is(err, ErrMalformed) {
			t.Fatalf("prefix of %d bytes: err = %v, want ErrMalformed", n, err)
		}
		if err := skip.Decode(payload[:n], &b); !errors.Is(err, ErrMalformed) {
			t.Fatalf("prefix of %d bytes, skipping token IDs: err = %v, want ErrMalformed", n, err)
		}
	}
	// A negative token and one above 2^32 among common ones are refused.
	for _, bad := range [][]byte{{0xff}, {0xd0, 0x80}, {0xcf, 0, 0, 0, 0x01, 0, 0, 0, 0}} {
		p := []byte{0x92, 0x01, 0x91, 0x95, 0xab}
		p = append(p, "BlockStored"...)
		p = append(p, 0x91, 0x01, 0xc0, 0x93, 0x01, 0xce, 0, 0, 0, 0x02)
		p = append(p, bad...)
		p = append(p, 0x10)
		if err := d.Decode(p, &b); !errors.Is(err, ErrMalformed) {
			t.Fatalf("token % x: err = %v, want ErrMalformed", bad, err)
		}
		if err := skip.Decode(p, &b); !errors.Is(err, ErrMalformed) {
			t.Fatalf("token % x, skipping token IDs: err = %v, want ErrMalformed", bad, err)
		}
	}
}
