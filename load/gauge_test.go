package load

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	"github.com/vmihailenco/msgpack/v5"
)

// mp encodes values with their exact msgpack widths (no compaction), so the tests cover
// every integer and float encoding the decoder must accept.
func mp(t testing.TB, vals ...any) []byte {
	t.Helper()
	var buf bytes.Buffer
	enc := msgpack.NewEncoder(&buf)
	if err := enc.EncodeArrayLen(len(vals)); err != nil {
		t.Fatal(err)
	}
	for _, v := range vals {
		var err error
		switch v := v.(type) {
		case int8:
			err = enc.EncodeInt8(v)
		case int16:
			err = enc.EncodeInt16(v)
		case int32:
			err = enc.EncodeInt32(v)
		case int64:
			err = enc.EncodeInt64(v)
		case uint8:
			err = enc.EncodeUint8(v)
		case uint16:
			err = enc.EncodeUint16(v)
		case uint32:
			err = enc.EncodeUint32(v)
		case uint64:
			err = enc.EncodeUint64(v)
		case int:
			err = enc.EncodeInt(int64(v)) // compact (fixnum where it fits)
		case float32:
			err = enc.EncodeFloat32(v)
		case float64:
			err = enc.EncodeFloat64(v)
		case []byte:
			err = enc.EncodeBytes(v)
		default:
			err = enc.Encode(v)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	return buf.Bytes()
}

func TestDecodeGauge(t *testing.T) {
	basic := HasRunning | HasWaiting | HasUsedTokens
	tests := []struct {
		name    string
		payload []byte
		want    RankReport
		wantErr string
	}{
		{
			name:    "6 elements, compact ints",
			payload: mp(t, "LoadStat", 3, 2, 1500, 100000, 1),
			want:    RankReport{DPRank: 1, Fields: basic | HasCapacity, Running: 3, Waiting: 2, UsedTokens: 1500, MaxTotalTokens: 100000, At: recvAt},
		},
		{
			name:    "6 elements, every int width",
			payload: mp(t, "LoadStat", int8(3), uint16(2), int32(1500), uint64(100000), int64(0)),
			want:    RankReport{Fields: basic | HasCapacity, Running: 3, Waiting: 2, UsedTokens: 1500, MaxTotalTokens: 100000, At: recvAt},
		},
		{
			name:    "6 elements, floats and no capacity",
			payload: mp(t, "LoadStat", float64(3), float32(2), float64(1500.9), uint8(0), int16(2)),
			want:    RankReport{DPRank: 2, Fields: basic, Running: 3, Waiting: 2, UsedTokens: 1500, At: recvAt},
		},
		{
			name:    "bin tag",
			payload: mp(t, []byte("LoadStat"), 0, 0, 0, 0, 0),
			want:    RankReport{Fields: basic, At: recvAt},
		},
		{
			name:    "11 elements is native with counters",
			payload: mp(t, "LoadStat", 4, 1, 2000, 50000, 0, 640, 2600, uint32(48), uint64(1<<40), int64(3_000_000)),
			want: RankReport{Fields: basic | HasCapacity | HasNative | HasWaitingUncached, Running: 4, Waiting: 1,
				UsedTokens: 2000, MaxTotalTokens: 50000, WaitingUncachedTokens: 640, TotalTokens: 2600,
				MaxRunningRequests: 48, HasCounters: true, TotalPrefillUncached: 1 << 40, TotalPrefillBusyUs: 3_000_000, At: recvAt},
		},
		{name: "empty", payload: nil, wantErr: "EOF"},
		{name: "not an array", payload: mp(t, "LoadStat")[1:], wantErr: "array length"},
		{name: "5 elements", payload: mp(t, "LoadStat", 1, 2, 3, 4), wantErr: "array of 5 elements"},
		{name: "7 elements", payload: mp(t, "LoadStat", 1, 2, 3, 4, 5, 6), wantErr: "array of 7 elements"},
		{name: "12 elements", payload: mp(t, "LoadStat", 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11), wantErr: "array of 12 elements"},
		{name: "nil array", payload: []byte{0xc0}, wantErr: "array of -1 elements"},
		{name: "wrong tag", payload: mp(t, "LoadStaT", 1, 2, 3, 4, 0), wantErr: `tag "LoadStaT"`},
		{name: "short tag", payload: mp(t, "Load", 1, 2, 3, 4, 0), wantErr: "tag of 4 bytes"},
		{name: "numeric tag", payload: mp(t, 7, 1, 2, 3, 4, 0), wantErr: "tag is not a string"},
		{name: "string count", payload: mp(t, "LoadStat", "1", 2, 3, 4, 0), wantErr: "element 1 (num_running_reqs): not a number"},
		{name: "nil count", payload: mp(t, "LoadStat", 1, nil, 3, 4, 0), wantErr: "element 2 (num_waiting_reqs): not a number"},
		{name: "bool count", payload: mp(t, "LoadStat", 1, 2, true, 4, 0), wantErr: "element 3 (num_tokens): not a number"},
		{name: "negative count", payload: mp(t, "LoadStat", 1, 2, 3, -4, 0), wantErr: "negative count -4"},
		{name: "uint64 overflow", payload: mp(t, "LoadStat", 1, 2, 3, uint64(1<<63), 0), wantErr: "out of range"},
		{name: "NaN", payload: mp(t, "LoadStat", 1, 2, 3, 4, 0, 1, 2, 3, 4, float64(nan())), wantErr: "not a finite number"},
		{name: "rank out of range", payload: mp(t, "LoadStat", 1, 2, 3, 4, 99999), wantErr: "attn_dp_rank 99999"},
		{name: "truncated", payload: mp(t, "LoadStat", 1, 2, 3, 4, int64(5))[:20], wantErr: "EOF"},
		{name: "trailing bytes", payload: append(mp(t, "LoadStat", 1, 2, 3, 4, 0), 0x01), wantErr: "1 trailing bytes"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := DecodeGauge(tt.payload, recvAt)
			if tt.wantErr != "" {
				if err == nil {
					t.Fatalf("got %+v, want error containing %q", got, tt.wantErr)
				}
				if !errors.Is(err, ErrMalformed) || !strings.Contains(err.Error(), tt.wantErr) ||
					!strings.HasPrefix(err.Error(), "cannot decode load gauge: ") {
					t.Fatalf("error %q: want ErrMalformed, prefix \"cannot decode load gauge: \", containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("unexpected error: %v", err)
			}
			if got != tt.want {
				t.Errorf("\n got %+v\nwant %+v", got, tt.want)
			}
		})
	}
}

func TestAppendGaugeRoundTrip(t *testing.T) {
	r := RankReport{DPRank: 3, Running: 7, Waiting: 300, UsedTokens: 1 << 33, MaxTotalTokens: 1 << 34,
		WaitingUncachedTokens: 90000, TotalTokens: 1 << 33, MaxRunningRequests: 256,
		HasCounters: true, TotalPrefillUncached: 123456789, TotalPrefillBusyUs: 987654321}
	prefix := []byte("keep")
	for _, extended := range []bool{false, true} {
		buf := AppendGauge(append([]byte(nil), prefix...), r, extended)
		if !bytes.HasPrefix(buf, prefix) {
			t.Fatalf("extended=%v: prefix lost", extended)
		}
		got, err := DecodeGauge(buf[len(prefix):], recvAt)
		if err != nil {
			t.Fatalf("extended=%v: %v", extended, err)
		}
		want := RankReport{DPRank: 3, Fields: HasRunning | HasWaiting | HasUsedTokens | HasCapacity,
			Running: 7, Waiting: 300, UsedTokens: 1 << 33, MaxTotalTokens: 1 << 34, At: recvAt}
		if extended {
			want.Fields |= HasNative | HasWaitingUncached
			want.WaitingUncachedTokens, want.TotalTokens, want.MaxRunningRequests = r.WaitingUncachedTokens, r.TotalTokens, r.MaxRunningRequests
			want.HasCounters, want.TotalPrefillUncached, want.TotalPrefillBusyUs = true, r.TotalPrefillUncached, r.TotalPrefillBusyUs
		}
		if got != want {
			t.Errorf("extended=%v:\n got %+v\nwant %+v", extended, got, want)
		}
	}
}

func nan() float64 {
	z := 0.0
	return z / z
}
