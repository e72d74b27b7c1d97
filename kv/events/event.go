package events

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"

	"github.com/vmihailenco/msgpack/v5"
)

// EventKind is the type of one KV event.
type EventKind uint8

// KV event kinds.
const (
	// EventBlockStored: blocks entered the engine's cache.
	EventBlockStored EventKind = iota + 1
	// EventBlockRemoved: blocks left the engine's cache (one tier, or all of them).
	EventBlockRemoved
	// EventAllBlocksCleared: the engine's cache was emptied.
	EventAllBlocksCleared
)

// Wire tags of the event kinds.
const (
	tagBlockStored      = "BlockStored"
	tagBlockRemoved     = "BlockRemoved"
	tagAllBlocksCleared = "AllBlocksCleared"
)

// String returns the wire tag of k.
func (k EventKind) String() string {
	switch k {
	case EventBlockStored:
		return tagBlockStored
	case EventBlockRemoved:
		return tagBlockRemoved
	case EventAllBlocksCleared:
		return tagAllBlocksCleared
	}
	return fmt.Sprintf("EventKind(%d)", uint8(k))
}

// Medium is the storage tier an event concerns.
type Medium uint8

// Storage tiers. MediumNone means the event carried no medium (absent or null): a store
// without one means GPU, a remove without one concerns every tier.
const (
	MediumNone Medium = iota
	MediumGPU
	MediumCPUPinned
	MediumDisk
	MediumExternal
	// MediumOther is a medium name this package does not know; it is encoded as "OTHER".
	MediumOther
)

// String returns the wire name of m, or "" for MediumNone.
func (m Medium) String() string {
	switch m {
	case MediumNone:
		return ""
	case MediumGPU:
		return "GPU"
	case MediumCPUPinned:
		return "CPU_PINNED"
	case MediumDisk:
		return "DISK"
	case MediumExternal:
		return "EXTERNAL"
	}
	return "OTHER"
}

// ParseMedium maps a wire name to a Medium; an unknown name is MediumOther.
func ParseMedium(name string) Medium { return parseMedium([]byte(name)) }

func parseMedium(name []byte) Medium {
	switch string(name) {
	case "GPU":
		return MediumGPU
	case "CPU_PINNED":
		return MediumCPUPinned
	case "DISK":
		return MediumDisk
	case "EXTERNAL":
		return MediumExternal
	}
	return MediumOther
}

// Shape selects how events are encoded: a tagged array or a tagged map. The batch itself
// is an array in both.
type Shape uint8

// Event shapes.
const (
	// ShapeArray: ["BlockStored", block_hashes, parent_block_hash, token_ids, block_size,
	// lora_id, medium?].
	ShapeArray Shape = iota
	// ShapeMap: {"type": "BlockStored", "block_hashes": [...], ...}.
	ShapeMap
)

// String returns "array" or "map".
func (s Shape) String() string {
	if s == ShapeMap {
		return "map"
	}
	return "array"
}

// ParseShape parses "array" or "map".
func ParseShape(s string) (Shape, error) {
	switch s {
	case "array":
		return ShapeArray, nil
	case "map":
		return ShapeMap, nil
	}
	return 0, fmt.Errorf("cannot parse event shape %q: want array or map", s)
}

// Sanity caps enforced by the decoder, per event.
const (
	MaxHashesPerEvent = 65536
	MaxTokensPerEvent = 1 << 20
)

// Decoding errors. Every decoding error wraps ErrMalformed; one that exceeds a sanity cap
// also wraps ErrTooLarge.
var (
	ErrMalformed = errors.New("malformed KV event batch")
	ErrTooLarge  = errors.New("KV event exceeds a sanity cap")
)

// Event is one KV event. Which fields are meaningful depends on Kind.
type Event struct {
	Kind EventKind
	// BlockHashes are the blocks stored or removed (BlockStored, BlockRemoved).
	BlockHashes []int64
	// ParentHash is the hash of the block before BlockHashes[0] when HasParent; a first
	// block has none (null or 0 on the wire).
	ParentHash int64
	HasParent  bool
	// TokenIDs are the tokens of the stored blocks (BlockStored).
	TokenIDs []uint32
	// BlockSize is the engine's tokens per block (BlockStored).
	BlockSize int
	// LoRAID is the adapter the blocks belong to when HasLoRA.
	LoRAID  int64
	HasLoRA bool
	// Medium is the storage tier, MediumNone when the event carried none.
	Medium Medium
}

// EventBatch is one published message: [ts, events, attn_dp_rank?].
type EventBatch struct {
	// TS is the engine's timestamp in unix seconds.
	TS     float64
	Events []Event
	// DPRank is the attention data-parallel rank when HasDPRank.
	DPRank    int
	HasDPRank bool
	// Skipped counts events of unknown type the decoder skipped.
	Skipped int
}

// Encoder encodes event batches with msgpack. It reuses its buffer; it is not safe for
// concurrent use.
type Encoder struct {
	buf bytes.Buffer
	enc *msgpack.Encoder
	// TrailingNils appends this many nil elements to array-shaped BlockStored events that
	// carry a medium, as vLLM appends lora_name and extra keys. Default 0.
	TrailingNils int
}

// NewEncoder returns an Encoder.
func NewEncoder() *Encoder {
	e := &Encoder{}
	e.enc = msgpack.NewEncoder(&e.buf)
	return e
}

// Encode encodes b with its events in the given shape. The result aliases the encoder's
// buffer and is valid until the next call.
func (e *Encoder) Encode(b *EventBatch, shape Shape) ([]byte, error) {
	e.buf.Reset()
	if err := e.encodeBatch(b, shape); err != nil {
		return nil, fmt.Errorf("cannot encode KV event batch: %w", err)
	}
	return e.buf.Bytes(), nil
}

// AppendEventBatch appends the msgpack encoding of b to dst.
func AppendEventBatch(dst []byte, b *EventBatch, shape Shape) ([]byte, error) {
	e := NewEncoder()
	out, err := e.Encode(b, shape)
	if err != nil {
		return dst, err
	}
	return append(dst, out...), nil
}

func (e *Encoder) encodeBatch(b *EventBatch, shape Shape) error {
	enc := e.enc
	n := 2
	if b.HasDPRank {
		n = 3
	}
	if err := enc.EncodeArrayLen(n); err != nil {
		return err
	}
	if err := enc.EncodeFloat64(b.TS); err != nil {
		return err
	}
	if err := enc.EncodeArrayLen(len(b.Events)); err != nil {
		return err
	}
	for i := range b.Events {
		var err error
		if shape == ShapeMap {
			err = e.encodeMapEvent(&b.Events[i])
		} else {
			err = e.encodeArrayEvent(&b.Events[i])
		}
		if err != nil {
			return fmt.Errorf("events[%d]: %w", i, err)
		}
	}
	if b.HasDPRank {
		return enc.EncodeInt(int64(b.DPRank))
	}
	return nil
}

func (e *Encoder) encodeArrayEvent(ev *Event) error {
	enc := e.enc
	withMedium := 0
	if ev.Medium != MediumNone {
		withMedium = 1
	}
	var err error
	switch ev.Kind {
	case EventBlockStored:
		trailing := 0
		if withMedium == 1 {
			trailing = max(e.TrailingNils, 0)
		}
		err = errors.Join(enc.EncodeArrayLen(6+withMedium+trailing), enc.EncodeString(tagBlockStored),
			e.encodeHashes(ev.BlockHashes), e.encodeParent(ev), e.encodeTokens(ev.TokenIDs),
			enc.EncodeInt(int64(ev.BlockSize)), e.encodeLoRA(ev))
	case EventBlockRemoved:
		err = errors.Join(enc.EncodeArrayLen(2+withMedium), enc.EncodeString(tagBlockRemoved),
			e.encodeHashes(ev.BlockHashes))
	case EventAllBlocksCleared:
		return errors.Join(enc.EncodeArrayLen(1), enc.EncodeString(tagAllBlocksCleared))
	default:
		return fmt.Errorf("unknown event kind %d", ev.Kind)
	}
	if err == nil && withMedium == 1 {
		err = enc.EncodeString(ev.Medium.String())
	}
	if ev.Kind == EventBlockStored && withMedium == 1 {
		for i := 0; err == nil && i < e.TrailingNils; i++ {
			err = enc.EncodeNil()
		}
	}
	return err
}

func (e *Encoder) encodeMapEvent(ev *Event) error {
	enc := e.enc
	withMedium := 0
	if ev.Medium != MediumNone {
		withMedium = 1
	}
	var err error
	switch ev.Kind {
	case EventBlockStored:
		err = errors.Join(enc.EncodeMapLen(6+withMedium),
			enc.EncodeString("type"), enc.EncodeString(tagBlockStored),
			enc.EncodeString("block_hashes"), e.encodeHashes(ev.BlockHashes),
			enc.EncodeString("parent_block_hash"), e.encodeParent(ev),
			enc.EncodeString("token_ids"), e.encodeTokens(ev.TokenIDs),
			enc.EncodeString("block_size"), enc.EncodeInt(int64(ev.BlockSize)),
			enc.EncodeString("lora_id"), e.encodeLoRA(ev))
	case EventBlockRemoved:
		err = errors.Join(enc.EncodeMapLen(2+withMedium),
			enc.EncodeString("type"), enc.EncodeString(tagBlockRemoved),
			enc.EncodeString("block_hashes"), e.encodeHashes(ev.BlockHashes))
	case EventAllBlocksCleared:
		return errors.Join(enc.EncodeMapLen(1), enc.EncodeString("type"), enc.EncodeString(tagAllBlocksCleared))
	default:
		return fmt.Errorf("unknown event kind %d", ev.Kind)
	}
	if err == nil && withMedium == 1 {
		err = errors.Join(enc.EncodeString("medium"), enc.EncodeString(ev.Medium.String()))
	}
	return err
}

func (e *Encoder) encodeHashes(hs []int64) error {
	if err := e.enc.EncodeArrayLen(len(hs)); err != nil {
		return err
	}
	for _, h := range hs {
		if err := e.enc.EncodeInt(h); err != nil {
			return err
		}
	}
	return nil
}

func (e *Encoder) encodeTokens(ts []uint32) error {
	if err := e.enc.EncodeArrayLen(len(ts)); err != nil {
		return err
	}
	for _, t := range ts {
		if err := e.enc.EncodeUint(uint64(t)); err != nil {
			return err
		}
	}
	return nil
}

func (e *Encoder) encodeParent(ev *Event) error {
	if !ev.HasParent {
		return e.enc.EncodeNil()
	}
	return e.enc.EncodeInt(ev.ParentHash)
}

func (e *Encoder) encodeLoRA(ev *Event) error {
	if !ev.HasLoRA {
		return e.enc.EncodeNil()
	}
	return e.enc.EncodeInt(ev.LoRAID)
}

// DecodeEventBatch decodes one event-batch payload into a new EventBatch.
func DecodeEventBatch(payload []byte) (*EventBatch, error) {
	var d Decoder
	b := &EventBatch{}
	if err := d.Decode(payload, b); err != nil {
		return nil, err
	}
	return b, nil
}

// Decoder decodes event batches. It accepts both event shapes, ignores unknown map keys and
// extra trailing array elements, takes a parent hash of null or 0 as "no parent", reads
// token IDs as unsigned 32-bit values, skips events of unknown type (counting them in
// EventBatch.Skipped), enforces MaxHashesPerEvent and MaxTokensPerEvent, and never panics.
// A block hash sent as msgpack bin or str (as some vLLM versions do) is read as a big-endian
// int64 when it has 8 bytes and as its FNV-1a 64-bit hash otherwise.
//
// A Decoder reuses its buffers: it allocates only while they grow. It is not safe for
// concurrent use.
type Decoder struct {
	// SkipTokenIDs: token_ids lists are checked as usual (each an unsigned 32-bit value, at
	// most MaxTokensPerEvent) but not kept, so events carry no TokenIDs. For a consumer that
	// keys blocks by the engine's own hashes.
	SkipTokenIDs bool

	r      reader
	hashes []int64
	tokens []uint32
	events []Event
	spans  []eventSpan
}

// eventSpan records where an event's slices lie in the decoder's buffers while they grow.
type eventSpan struct{ h0, h1, t0, t1 int }

// Decode decodes payload into b. The slices of b (Events and each event's BlockHashes and
// TokenIDs) alias the decoder's buffers and stay valid until the next call. On error b is
// reset to the zero batch.
func (d *Decoder) Decode(payload []byte, b *EventBatch) error {
	d.r = reader{b: payload}
	d.hashes, d.tokens, d.events, d.spans = d.hashes[:0], d.tokens[:0], d.events[:0], d.spans[:0]
	*b = EventBatch{}
	if err := d.batch(b); err != nil {
		*b = EventBatch{}
		return fmt.Errorf("cannot decode KV event batch: %w: %w", ErrMalformed, err)
	}
	if d.r.off != len(payload) {
		*b = EventBatch{}
		return fmt.Errorf("cannot decode KV event batch: %w: %d trailing bytes", ErrMalformed, len(payload)-d.r.off)
	}
	for i := range d.events {
		s := d.spans[i]
		ev := &d.events[i]
		if s.h1 > s.h0 {
			ev.BlockHashes = d.hashes[s.h0:s.h1:s.h1]
		}
		if s.t1 > s.t0 {
			ev.TokenIDs = d.tokens[s.t0:s.t1:s.t1]
		}
	}
	b.Events = d.events
	return nil
}

func (d *Decoder) batch(b *EventBatch) error {
	c, err := d.r.peek()
	if err != nil {
		return err
	}
	if isMap(c) {
		return d.mapBatch(b)
	}
	n, err := d.r.arrayLen()
	if err != nil {
		return fmt.Errorf("batch: %w", err)
	}
	if n < 2 {
		return fmt.Errorf("batch: array of %d elements, want at least 2", n)
	}
	if b.TS, err = d.r.float(); err != nil {
		return fmt.Errorf("batch ts: %w", err)
	}
	if err := d.eventList(b); err != nil {
		return err
	}
	if n >= 3 {
		if b.DPRank, b.HasDPRank, err = d.optRank(); err != nil {
			return fmt.Errorf("batch attn_dp_rank: %w", err)
		}
	}
	return d.r.skipN(n-3, 0)
}

func (d *Decoder) mapBatch(b *EventBatch) error {
	n, err := d.r.mapLen()
	if err != nil {
		return fmt.Errorf("batch: %w", err)
	}
	sawEvents := false
	for range n {
		key, err := d.r.str()
		if err != nil {
			return fmt.Errorf("batch key: %w", err)
		}
		switch string(key) {
		case "ts":
			if b.TS, err = d.r.float(); err != nil {
				return fmt.Errorf("batch ts: %w", err)
			}
		case "events":
			if sawEvents {
				return errors.New("batch: duplicate events")
			}
			sawEvents = true
			if err := d.eventList(b); err != nil {
				return err
			}
		case "attn_dp_rank", "data_parallel_rank":
			if b.DPRank, b.HasDPRank, err = d.optRank(); err != nil {
				return fmt.Errorf("batch %s: %w", key, err)
			}
		default:
			if err := d.r.skip(0); err != nil {
				return err
			}
		}
	}
	if !sawEvents {
		return errors.New("batch: missing events")
	}
	return nil
}

func (d *Decoder) optRank() (int, bool, error) {
	if d.r.nilNext() {
		return 0, false, nil
	}
	v, neg, err := d.r.integer()
	if err != nil {
		return 0, false, err
	}
	if neg || uint64(v) > math.MaxInt32 { // unsigned: a uint64 past MaxInt64 wraps negative
		if !neg {
			return 0, false, fmt.Errorf("rank %d out of range", uint64(v))
		}
		return 0, false, fmt.Errorf("rank %d out of range", v)
	}
	return int(v), true, nil
}

func (d *Decoder) eventList(b *EventBatch) error {
	n, err := d.r.arrayLen()
	if err != nil {
		return fmt.Errorf("events: %w", err)
	}
	for i := range n {
		if err := d.event(b); err != nil {
			return fmt.Errorf("events[%d]: %w", i, err)
		}
	}
	return nil
}

// event decodes one event and appends it, or counts it as skipped.
func (d *Decoder) event(b *EventBatch) error {
	c, err := d.r.peek()
	if err != nil {
		return err
	}
	ev := Event{}
	sp := eventSpan{h0: len(d.hashes), h1: len(d.hashes), t0: len(d.tokens), t1: len(d.tokens)}
	var known bool
	if isMap(c) {
		known, err = d.mapEvent(&ev, &sp)
	} else {
		known, err = d.arrayEvent(&ev, &sp)
	}
	if err != nil {
		return err
	}
	if !known {
		// Drop anything the skipped event left in the buffers.
		d.hashes, d.tokens = d.hashes[:sp.h0], d.tokens[:sp.t0]
		b.Skipped++
		return nil
	}
	d.events = append(d.events, ev)
	d.spans = append(d.spans, sp)
	return nil
}

func (d *Decoder) arrayEvent(ev *Event, sp *eventSpan) (bool, error) {
	n, err := d.r.arrayLen()
	if err != nil {
		return false, err
	}
	if n < 1 {
		return false, errors.New("empty event array")
	}
	tag, err := d.r.str()
	if err != nil {
		return false, fmt.Errorf("tag: %w", err)
	}
	var used int
	switch string(tag) {
	case tagBlockStored:
		ev.Kind = EventBlockStored
		if n < 5 {
			return false, fmt.Errorf("BlockStored array of %d elements, want at least 5", n)
		}
		if err := d.hashList(sp); err != nil {
			return false, err
		}
		if err := d.parent(ev); err != nil {
			return false, err
		}
		if err := d.tokenList(sp); err != nil {
			return false, err
		}
		if ev.BlockSize, err = d.blockSize(); err != nil {
			return false, err
		}
		used = 5
		if n > 5 {
			if err := d.lora(ev); err != nil {
				return false, err
			}
			used = 6
		}
		if n > 6 {
			if ev.Medium, err = d.medium(); err != nil {
				return false, err
			}
			used = 7
		}
	case tagBlockRemoved:
		ev.Kind = EventBlockRemoved
		if n < 2 {
			return false, fmt.Errorf("BlockRemoved array of %d elements, want at least 2", n)
		}
		if err := d.hashList(sp); err != nil {
			return false, err
		}
		used = 2
		if n > 2 {
			if ev.Medium, err = d.medium(); err != nil {
				return false, err
			}
			used = 3
		}
	case tagAllBlocksCleared:
		ev.Kind = EventAllBlocksCleared
		used = 1
	default:
		return false, d.r.skipN(n-1, 0)
	}
	return true, d.r.skipN(n-used, 0)
}

func (d *Decoder) mapEvent(ev *Event, sp *eventSpan) (bool, error) {
	n, err := d.r.mapLen()
	if err != nil {
		return false, err
	}
	var sawHashes, sawType, unknownType bool
	for range n {
		key, err := d.r.str()
		if err != nil {
			return false, fmt.Errorf("key: %w", err)
		}
		switch string(key) {
		case "type":
			tag, err := d.r.str()
			if err != nil {
				return false, fmt.Errorf("type: %w", err)
			}
			sawType = true
			switch string(tag) {
			case tagBlockStored:
				ev.Kind = EventBlockStored
			case tagBlockRemoved:
				ev.Kind = EventBlockRemoved
			case tagAllBlocksCleared:
				ev.Kind = EventAllBlocksCleared
			default:
				unknownType = true
			}
		case "block_hashes":
			if sawHashes {
				return false, errors.New("duplicate block_hashes")
			}
			sawHashes = true
			if err := d.hashList(sp); err != nil {
				return false, err
			}
		case "parent_block_hash":
			if err := d.parent(ev); err != nil {
				return false, err
			}
		case "token_ids":
			if sp.t1 > sp.t0 {
				return false, errors.New("duplicate token_ids")
			}
			if err := d.tokenList(sp); err != nil {
				return false, err
			}
		case "block_size":
			if ev.BlockSize, err = d.blockSize(); err != nil {
				return false, err
			}
		case "lora_id":
			if err := d.lora(ev); err != nil {
				return false, err
			}
		case "medium":
			if ev.Medium, err = d.medium(); err != nil {
				return false, err
			}
		default:
			if err := d.r.skip(0); err != nil {
				return false, err
			}
		}
	}
	switch {
	case !sawType:
		return false, errors.New("event map without type")
	case unknownType:
		return false, nil
	case ev.Kind != EventAllBlocksCleared && !sawHashes:
		return false, fmt.Errorf("%s without block_hashes", ev.Kind)
	}
	return true, nil
}

func (d *Decoder) hashList(sp *eventSpan) error {
	n, err := d.r.arrayLen()
	if err != nil {
		return fmt.Errorf("block_hashes: %w", err)
	}
	if n > MaxHashesPerEvent {
		return fmt.Errorf("block_hashes: %w: %d hashes, at most %d", ErrTooLarge, n, MaxHashesPerEvent)
	}
	sp.h0 = len(d.hashes)
	d.hashes = slices.Grow(d.hashes, n) // n is bounded by the bytes left
	for i := 0; i < n; {
		// The common encodings in one loop (an engine's hashes are 64-bit integers); any
		// other value, and every error, goes through hash.
		k := d.r.fastInts(d.hashes[len(d.hashes) : len(d.hashes)+n-i])
		d.hashes, i = d.hashes[:len(d.hashes)+k], i+k
		if i == n {
			break
		}
		h, err := d.hash()
		if err != nil {
			return fmt.Errorf("block_hashes[%d]: %w", i, err)
		}
		d.hashes = append(d.hashes, h)
		i++
	}
	sp.h1 = len(d.hashes)
	return nil
}

func (d *Decoder) tokenList(sp *eventSpan) error {
	n, err := d.r.arrayLen()
	if err != nil {
		return fmt.Errorf("token_ids: %w", err)
	}
	if n > MaxTokensPerEvent {
		return fmt.Errorf("token_ids: %w: %d tokens, at most %d", ErrTooLarge, n, MaxTokensPerEvent)
	}
	keep := !d.SkipTokenIDs
	sp.t0 = len(d.tokens)
	if keep {
		d.tokens = slices.Grow(d.tokens, n) // n is bounded by the bytes left
	}
	for i := 0; i < n; i++ {
		// Token IDs below 2^32 in one loop without calls; anything else, and every
		// error, through integer.
		var k int
		if keep {
			k = d.r.fastTokens(d.tokens[len(d.tokens) : len(d.tokens)+n-i])
			d.tokens = d.tokens[:len(d.tokens)+k]
		} else {
			k = d.r.skipTokens(n - i)
		}
		if i += k; i == n {
			break
		}
		v, neg, err := d.r.integer()
		if err != nil {
			return fmt.Errorf("token_ids[%d]: %w", i, err)
		}
		if neg || uint64(v) > math.MaxUint32 {
			return fmt.Errorf("token_ids[%d]: %d is not an unsigned 32-bit value", i, v)
		}
		if keep {
			d.tokens = append(d.tokens, uint32(v))
		}
	}
	sp.t1 = len(d.tokens)
	return nil
}

// hash reads one block hash: an integer (wrapped to int64), or bytes.
func (d *Decoder) hash() (int64, error) {
	c, err := d.r.peek()
	if err != nil {
		return 0, err
	}
	if isStr(c) || isBin(c) {
		b, err := d.r.str()
		if err != nil {
			return 0, err
		}
		return bytesHash(b), nil
	}
	v, _, err := d.r.integer()
	return v, err
}

// bytesHash maps a hash sent as bytes to an int64.
func bytesHash(b []byte) int64 {
	if len(b) == 8 {
		return int64(binary.BigEndian.Uint64(b))
	}
	h := uint64(14695981039346656037)
	for _, c := range b {
		h ^= uint64(c)
		h *= 1099511628211
	}
	return int64(h)
}

func (d *Decoder) parent(ev *Event) error {
	if d.r.nilNext() {
		ev.HasParent, ev.ParentHash = false, 0
		return nil
	}
	h, err := d.hash()
	if err != nil {
		return fmt.Errorf("parent_block_hash: %w", err)
	}
	ev.ParentHash, ev.HasParent = h, h != 0
	return nil
}

func (d *Decoder) blockSize() (int, error) {
	if d.r.nilNext() {
		return 0, nil
	}
	v, neg, err := d.r.integer()
	if err != nil {
		return 0, fmt.Errorf("block_size: %w", err)
	}
	if neg || uint64(v) > MaxTokensPerEvent {
		return 0, fmt.Errorf("block_size %d out of range", v)
	}
	return int(v), nil
}

func (d *Decoder) lora(ev *Event) error {
	c, err := d.r.peek()
	if err != nil {
		return err
	}
	if !isInt(c) {
		// null, or a form this package does not interpret (a name): no adapter ID.
		return d.r.skip(0)
	}
	v, _, err := d.r.integer()
	if err != nil {
		return fmt.Errorf("lora_id: %w", err)
	}
	ev.LoRAID, ev.HasLoRA = v, true
	return nil
}

func (d *Decoder) medium() (Medium, error) {
	if d.r.nilNext() {
		return MediumNone, nil
	}
	b, err := d.r.str()
	if err != nil {
		return 0, fmt.Errorf("medium: %w", err)
	}
	return parseMedium(b), nil
}

// maxSkipDepth bounds the nesting of values the decoder skips.
const maxSkipDepth = 32

// reader reads msgpack from a byte slice without allocating.
type reader struct {
	b   []byte
	off int
}

var errShort = errors.New("unexpected end of payload")

func (r *reader) peek() (byte, error) {
	if r.off >= len(r.b) {
		return 0, errShort
	}
	return r.b[r.off], nil
}

func (r *reader) take(n int) ([]byte, error) {
	if n < 0 || n > len(r.b)-r.off {
		return nil, errShort
	}
	p := r.b[r.off : r.off+n]
	r.off += n
	return p, nil
}

func (r *reader) u8() (uint64, error) {
	p, err := r.take(1)
	if err != nil {
		return 0, err
	}
	return uint64(p[0]), nil
}

func (r *reader) u16() (uint64, error) {
	p, err := r.take(2)
	if err != nil {
		return 0, err
	}
	return uint64(binary.BigEndian.Uint16(p)), nil
}

func (r *reader) u32() (uint64, error) {
	p, err := r.take(4)
	if err != nil {
		return 0, err
	}
	return uint64(binary.BigEndian.Uint32(p)), nil
}

func (r *reader) u64() (uint64, error) {
	p, err := r.take(8)
	if err != nil {
		return 0, err
	}
	return binary.BigEndian.Uint64(p), nil
}

// fastTokens decodes leading unsigned integers below 2^32 (positive fixint, uint 8, 16 and
// 32) into dst, at most len(dst), and returns how many; it stops, consuming nothing of it,
// at any other value or one cut short.
func (r *reader) fastTokens(dst []uint32) int {
	b, off := r.b, r.off
	k := 0
	for ; k < len(dst) && off < len(b); k++ {
		switch c := b[off]; {
		case c <= 0x7f:
			dst[k] = uint32(c)
			off++
		case c == 0xce && len(b)-off >= 5:
			dst[k] = binary.BigEndian.Uint32(b[off+1:])
			off += 5
		case c == 0xcd && len(b)-off >= 3:
			dst[k] = uint32(binary.BigEndian.Uint16(b[off+1:]))
			off += 3
		case c == 0xcc && len(b)-off >= 2:
			dst[k] = uint32(b[off+1])
			off += 2
		default:
			r.off = off
			return k
		}
	}
	r.off = off
	return k
}

// skipTokens passes over up to n leading values fastTokens would decode and returns how
// many.
func (r *reader) skipTokens(n int) int {
	b, off := r.b, r.off
	k := 0
	for ; k < n && off < len(b); k++ {
		c := b[off]
		w := 1
		switch {
		case c <= 0x7f:
		case c == 0xce:
			w = 5
		case c == 0xcd:
			w = 3
		case c == 0xcc:
			w = 2
		default:
			w = 0
		}
		if w == 0 || len(b)-off < w {
			break
		}
		off += w
	}
	r.off = off
	return k
}

// fastInts decodes leading 64-bit and 32-bit integers (uint 64, int 64, uint 32, positive
// fixint) into dst as int64 (a uint64 wraps, as integer reads it), at most len(dst), and
// returns how many; it stops, consuming nothing of it, at any other value or one cut short.
func (r *reader) fastInts(dst []int64) int {
	b, off := r.b, r.off
	k := 0
	for ; k < len(dst) && off < len(b); k++ {
		switch c := b[off]; {
		case (c == 0xcf || c == 0xd3) && len(b)-off >= 9:
			dst[k] = int64(binary.BigEndian.Uint64(b[off+1:]))
			off += 9
		case c == 0xce && len(b)-off >= 5:
			dst[k] = int64(binary.BigEndian.Uint32(b[off+1:]))
			off += 5
		case c <= 0x7f:
			dst[k] = int64(c)
			off++
		default:
			r.off = off
			return k
		}
	}
	r.off = off
	return k
}

// nilNext consumes a nil and reports whether there was one.
func (r *reader) nilNext() bool {
	if r.off < len(r.b) && r.b[r.off] == 0xc0 {
		r.off++
		return true
	}
	return false
}

func isMap(c byte) bool { return c&0xf0 == 0x80 || c == 0xde || c == 0xdf }
func isStr(c byte) bool { return c&0xe0 == 0xa0 || c == 0xd9 || c == 0xda || c == 0xdb }
func isBin(c byte) bool { return c == 0xc4 || c == 0xc5 || c == 0xc6 }
func isInt(c byte) bool {
	return c <= 0x7f || c >= 0xe0 || (c >= 0xcc && c <= 0xd3)
}

// length checks a container or string length against the bytes left: every element needs
// at least perElem bytes. Small enough to inline, so that the division is by a constant.
func (r *reader) length(n uint64, perElem int) (int, error) {
	if n > uint64(len(r.b)-r.off)/uint64(perElem) {
		return 0, lengthError(n)
	}
	return int(n), nil
}

// lengthError is length's error, built out of line.
func lengthError(n uint64) error { return fmt.Errorf("length %d exceeds the payload", n) }

func (r *reader) arrayLen() (int, error) {
	c, err := r.u8()
	if err != nil {
		return 0, err
	}
	var n uint64
	switch {
	case c&0xf0 == 0x90:
		n = c & 0x0f
	case c == 0xdc:
		n, err = r.u16()
	case c == 0xdd:
		n, err = r.u32()
	default:
		return 0, fmt.Errorf("expected an array, got code 0x%02x", c)
	}
	if err != nil {
		return 0, err
	}
	return r.length(n, 1)
}

func (r *reader) mapLen() (int, error) {
	c, err := r.u8()
	if err != nil {
		return 0, err
	}
	var n uint64
	switch {
	case c&0xf0 == 0x80:
		n = c & 0x0f
	case c == 0xde:
		n, err = r.u16()
	case c == 0xdf:
		n, err = r.u32()
	default:
		return 0, fmt.Errorf("expected a map, got code 0x%02x", c)
	}
	if err != nil {
		return 0, err
	}
	return r.length(n, 2)
}

// str reads a str or bin value and returns its bytes, aliasing the payload.
func (r *reader) str() ([]byte, error) {
	c, err := r.u8()
	if err != nil {
		return nil, err
	}
	var n uint64
	switch {
	case c&0xe0 == 0xa0:
		n = uint64(c & 0x1f)
	case c == 0xd9 || c == 0xc4:
		n, err = r.u8()
	case c == 0xda || c == 0xc5:
		n, err = r.u16()
	case c == 0xdb || c == 0xc6:
		n, err = r.u32()
	default:
		return nil, fmt.Errorf("expected a string, got code 0x%02x", c)
	}
	if err != nil {
		return nil, err
	}
	ln, err := r.length(n, 1)
	if err != nil {
		return nil, err
	}
	return r.take(ln)
}

// integer reads any msgpack integer. v is its two's-complement 64-bit value (a uint64
// above MaxInt64 wraps); neg reports a negative signed value.
func (r *reader) integer() (v int64, neg bool, err error) {
	c, err := r.u8()
	if err != nil {
		return 0, false, err
	}
	var u uint64
	switch {
	case c <= 0x7f:
		return int64(c), false, nil
	case c >= 0xe0:
		return int64(int8(c)), true, nil
	case c == 0xcc:
		u, err = r.u8()
	case c == 0xcd:
		u, err = r.u16()
	case c == 0xce:
		u, err = r.u32()
	case c == 0xcf:
		u, err = r.u64()
	case c == 0xd0:
		u, err = r.u8()
		v = int64(int8(u))
	case c == 0xd1:
		u, err = r.u16()
		v = int64(int16(u))
	case c == 0xd2:
		u, err = r.u32()
		v = int64(int32(u))
	case c == 0xd3:
		u, err = r.u64()
		v = int64(u)
	default:
		return 0, false, fmt.Errorf("expected an integer, got code 0x%02x", c)
	}
	if err != nil {
		return 0, false, err
	}
	if c >= 0xd0 {
		return v, v < 0, nil
	}
	return int64(u), false, nil
}

// float reads a float or an integer as float64.
func (r *reader) float() (float64, error) {
	c, err := r.peek()
	if err != nil {
		return 0, err
	}
	switch c {
	case 0xca:
		r.off++
		u, err := r.u32()
		return float64(math.Float32frombits(uint32(u))), err
	case 0xcb:
		r.off++
		u, err := r.u64()
		return math.Float64frombits(u), err
	}
	v, neg, err := r.integer()
	if err != nil {
		return 0, err
	}
	if !neg && v < 0 {
		return float64(uint64(v)), nil
	}
	return float64(v), nil
}

// skipN skips n values.
func (r *reader) skipN(n, depth int) error {
	for range n {
		if err := r.skip(depth); err != nil {
			return err
		}
	}
	return nil
}

// skip skips one value of any type, nested at most maxSkipDepth deep.
func (r *reader) skip(depth int) error {
	if depth > maxSkipDepth {
		return errors.New("values nested too deep")
	}
	c, err := r.peek()
	if err != nil {
		return err
	}
	switch {
	case c <= 0x7f || c >= 0xe0 || c == 0xc0 || c == 0xc2 || c == 0xc3:
		r.off++
		return nil
	case isInt(c):
		_, _, err := r.integer()
		return err
	case c == 0xca || c == 0xcb:
		_, err := r.float()
		return err
	case isStr(c) || isBin(c):
		_, err := r.str()
		return err
	case c&0xf0 == 0x90 || c == 0xdc || c == 0xdd:
		n, err := r.arrayLen()
		if err != nil {
			return err
		}
		return r.skipN(n, depth+1)
	case isMap(c):
		n, err := r.mapLen()
		if err != nil {
			return err
		}
		return r.skipN(2*n, depth+1)
	}
	// Extension types.
	r.off++
	var n uint64
	switch c {
	case 0xd4:
		n = 2
	case 0xd5:
		n = 3
	case 0xd6:
		n = 5
	case 0xd7:
		n = 9
	case 0xd8:
		n = 17
	case 0xc7:
		n, err = r.u8()
		n++
	case 0xc8:
		n, err = r.u16()
		n++
	case 0xc9:
		n, err = r.u32()
		n++
	default:
		return fmt.Errorf("invalid code 0x%02x", c)
	}
	if err != nil {
		return err
	}
	ln, err := r.length(n, 1)
	if err != nil {
		return err
	}
	_, err = r.take(ln)
	return err
}
