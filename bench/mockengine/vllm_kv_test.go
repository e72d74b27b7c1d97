package mockengine

import (
	"context"
	"encoding/binary"
	"io"
	"log"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/vmihailenco/msgpack/v5"

	"switchyard/kv/events"
	"switchyard/kv/hashing"
)

// TestVLLMKVEventFormat checks, with an independent ZeroMQ client (go-zeromq/zmq4) and a
// generic msgpack decoder, what --kv-format vllm puts on the wire: per rank r the topic
// kv@host:(HTTP port + r)@model and data_parallel_rank r, block hashes the router does not
// reproduce, 0 as a first block's parent, BlockStored arrays of nine elements (medium and two
// trailing nils), and replay replies (topic, seq, payload) ending ("", 2^64-1, "").
func TestVLLMKVEventFormat(t *testing.T) {
	e := startEngine(t, Config{ZeroCost: true, DPSize: 2, KVEvents: KVEvents{Format: KVFormatVLLM, Replay: true}})
	host, port, _ := net.SplitHostPort(strings.TrimPrefix(e.URL(), "http://"))
	p, _ := strconv.Atoi(port)
	c := newClient(t)
	for rank := range 2 {
		topic := "kv@" + host + ":" + strconv.Itoa(p+rank) + "@" + e.cfg.Model
		sub := dialSub(t, e.KVEventsEndpoint(rank), "")
		// Requests go to the ranks in turn; flush until this rank's subscription is live.
		var stored zmq4.Msg
		deadline := time.Now().Add(testDeadline)
		for i := 0; stored.Frames == nil && time.Now().Before(deadline); i++ {
			// A new prompt each time: one a rank already cached publishes nothing.
			prompt := strings.Repeat("vllm wire format "+strconv.Itoa(rank)+"."+strconv.Itoa(i)+" ", 20)
			do(t, c, "POST", e.URL()+"/v1/completions", map[string]any{"model": e.cfg.Model, "prompt": prompt, "max_tokens": 1})
			select {
			case m := <-sub.msgs:
				if _, b := kvBatch(t, m, topic); len(b.Events) > 0 && b.Events[0].Kind == events.EventBlockStored {
					stored = m
				}
			case <-time.After(50 * time.Millisecond):
			}
		}
		if stored.Frames == nil {
			t.Fatalf("rank %d: no BlockStored", rank)
		}
		_, b := kvBatch(t, stored, topic)
		if !b.HasDPRank || b.DPRank != rank {
			t.Fatalf("rank %d: data_parallel_rank %v %d", rank, b.HasDPRank, b.DPRank)
		}
		ev := b.Events[0]
		if router := hashing.AppendBlockHashes(nil, ev.TokenIDs, ev.BlockSize); len(router) == 0 || router[0] == ev.BlockHashes[0] {
			t.Fatalf("rank %d: the first block's hash is the router's", rank)
		}
		var raw []any
		if err := msgpack.Unmarshal(stored.Frames[2], &raw); err != nil {
			t.Fatal(err)
		}
		evs := raw[1].([]any)
		first := evs[0].([]any)
		if len(first) != 9 || first[0] != "BlockStored" || first[6] != "GPU" || first[7] != nil || first[8] != nil {
			t.Fatalf("rank %d: BlockStored array %v", rank, first)
		}
		if parent, ok := first[2].(int8); !ok || parent != 0 {
			if u, ok := first[2].(uint8); !ok || u != 0 {
				t.Fatalf("rank %d: first parent %#v, want 0", rank, first[2])
			}
		}
		// The replay socket answers in the current layout.
		frames := replayRaw(t, e.ReplayEndpoint(rank))
		last := frames[len(frames)-1]
		if len(last) != 4 || len(last[0]) != 0 || len(last[1]) != 0 || binary.BigEndian.Uint64(last[2]) != ^uint64(0) || len(last[3]) != 0 {
			t.Fatalf("rank %d: end marker %q", rank, last)
		}
		for _, f := range frames[:len(frames)-1] {
			if len(f) != 4 || len(f[0]) != 0 || string(f[1]) != topic || len(f[2]) != 8 {
				t.Fatalf("rank %d: replay reply %q", rank, f)
			}
		}
		if len(frames) < 2 {
			t.Fatalf("rank %d: nothing replayed", rank)
		}
	}
}

// replayRaw asks a replay socket for everything from seq 0 with a REQ-style delimiter and
// returns every reply's frames, the end marker last.
func replayRaw(t *testing.T, endpoint string) [][][]byte {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testDeadline)
	defer cancel()
	sock := zmq4.NewDealer(ctx, zmq4.WithLogger(log.New(io.Discard, "", 0)), zmq4.WithDialerMaxRetries(0))
	defer sock.Close()
	if err := sock.Dial(endpoint); err != nil {
		t.Fatal(err)
	}
	if err := sock.Send(zmq4.NewMsgFrom([]byte{}, make([]byte, 8))); err != nil {
		t.Fatal(err)
	}
	var out [][][]byte
	for {
		m, err := sock.Recv()
		if err != nil {
			t.Fatalf("replay: %v", err)
		}
		out = append(out, m.Frames)
		if len(m.Frames) == 4 && len(m.Frames[2]) == 8 && binary.BigEndian.Uint64(m.Frames[2]) == ^uint64(0) {
			return out
		}
	}
}
