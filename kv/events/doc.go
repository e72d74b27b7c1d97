// Package events is the KV-event wire format of INTEROP.md: an EventBatch [ts, events,
// attn_dp_rank?] of BlockStored, BlockRemoved and AllBlocksCleared events, encoded with
// msgpack as tagged arrays or tagged maps (Encoder, AppendEventBatch) and decoded from either
// shape by a hand-written, allocation-free msgpack reader (Decoder, DecodeEventBatch) that
// takes every variant INTEROP.md lists, enforces the per-event caps (MaxHashesPerEvent,
// MaxTokensPerEvent) and never panics: bad input is an error wrapping ErrMalformed. Token IDs
// and block hashes in their common encodings are read in a loop of their own; a consumer that
// does not need the token IDs sets Decoder.SkipTokenIDs (they are checked, not kept). Medium
// names a block's storage tier as engines report it.
//
// An Encoder and a Decoder each reuse their buffers and belong to one goroutine at a time;
// keep one per subscription. The slices of a batch decoded by Decoder.Decode alias the
// decoder's buffers and are valid only until its next Decode call: copy what must outlive it.
package events
