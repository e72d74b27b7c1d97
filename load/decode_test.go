package load

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"
)

var recvAt = time.Date(2026, 3, 1, 12, 0, 10, 0, time.UTC)

const nativeRank0 = `{"dp_rank":0,"num_running_reqs":3,"num_waiting_reqs":2,"num_waiting_uncached_tokens":700,` +
	`"num_used_tokens":5000,"num_total_tokens":6000,"max_total_num_tokens":100000,"max_running_requests":64,` +
	`"token_usage":0.05,"gen_throughput":120.5,"cache_hit_rate":0.4,"utilization":0.3}`

func TestDecodeLoads(t *testing.T) {
	engineAt := time.Date(2026, 3, 1, 12, 0, 9, 500_000_000, time.UTC)
	nativeFields := HasNative | HasRunning | HasWaiting | HasUsedTokens | HasWaitingUncached | HasCapacity
	tests := []struct {
		name    string
		body    string
		want    []RankReport
		wantErr string
	}{
		{
			name: "float timestamp",
			body: `{"timestamp":` + jsonFloat(engineAt) + `,"version":"0.5","loads":[` + nativeRank0 + `]}`,
			want: []RankReport{{DPRank: 0, Fields: nativeFields, Running: 3, Waiting: 2, UsedTokens: 5000,
				MaxTotalTokens: 100000, WaitingUncachedTokens: 700, TotalTokens: 6000, MaxRunningRequests: 64, At: engineAt}},
		},
		{
			name: "iso timestamp with zone",
			body: `{"timestamp":"2026-03-01T13:00:09.5+01:00","loads":[` + nativeRank0 + `]}`,
			want: []RankReport{{DPRank: 0, Fields: nativeFields, Running: 3, Waiting: 2, UsedTokens: 5000,
				MaxTotalTokens: 100000, WaitingUncachedTokens: 700, TotalTokens: 6000, MaxRunningRequests: 64, At: engineAt}},
		},
		{
			name: "iso timestamp without zone is UTC",
			body: `{"timestamp":"2026-03-01T12:00:09.500000","loads":[` + nativeRank0 + `]}`,
			want: []RankReport{{DPRank: 0, Fields: nativeFields, Running: 3, Waiting: 2, UsedTokens: 5000,
				MaxTotalTokens: 100000, WaitingUncachedTokens: 700, TotalTokens: 6000, MaxRunningRequests: 64, At: engineAt}},
		},
		{
			name: "missing timestamp uses receipt",
			body: `{"loads":[{"dp_rank":0,"num_running_reqs":1}]}`,
			want: []RankReport{{Fields: HasNative | HasRunning, Running: 1, At: recvAt}},
		},
		{
			name: "unreadable timestamp uses receipt",
			body: `{"timestamp":"yesterday","loads":[{"dp_rank":0,"num_running_reqs":1}]}`,
			want: []RankReport{{Fields: HasNative | HasRunning, Running: 1, At: recvAt}},
		},
		{
			name: "future timestamp is clamped to receipt",
			body: `{"timestamp":` + jsonFloat(recvAt.Add(time.Hour)) + `,"loads":[{"dp_rank":0,"num_running_reqs":1}]}`,
			want: []RankReport{{Fields: HasNative | HasRunning, Running: 1, At: recvAt}},
		},
		{
			name: "counters, sections and unknown keys",
			body: `{"timestamp":null,"loads":[{"dp_rank":1,"num_running_reqs":1.0,"num_waiting_reqs":0,` +
				`"max_total_num_tokens":0,"total_prefill_uncached_tokens":1000,"total_prefill_busy_us":2e6,` +
				`"memory":{"weight":1},"queues":[1,2],"brand_new":"x"},` +
				`{"dp_rank":0,"num_running_reqs":2,"total_prefill_uncached_tokens":5}]}`,
			want: []RankReport{
				{DPRank: 1, Fields: HasNative | HasRunning | HasWaiting, Running: 1, HasCounters: true,
					TotalPrefillUncached: 1000, TotalPrefillBusyUs: 2_000_000, At: recvAt},
				{DPRank: 0, Fields: HasNative | HasRunning, Running: 2, At: recvAt},
			},
		},
		{name: "not json", body: `{"loads":`, wantErr: "cannot decode /v1/loads body"},
		{name: "array body", body: `[` + nativeRank0 + `]`, wantErr: "cannot unmarshal array"},
		{name: "missing loads", body: `{"timestamp":1}`, wantErr: `missing "loads"`},
		{name: "empty loads", body: `{"loads":[]}`, wantErr: "no DP ranks"},
		{name: "string count", body: `{"loads":[{"dp_rank":0,"num_running_reqs":"3"}]}`, wantErr: "not a number"},
		{name: "negative count", body: `{"loads":[{"dp_rank":0,"num_waiting_reqs":-1}]}`, wantErr: "negative count"},
		{name: "huge count", body: `{"loads":[{"dp_rank":0,"num_used_tokens":1e300}]}`, wantErr: "out of range"},
		{name: "missing dp_rank among many", body: `{"loads":[{"dp_rank":0},{"num_running_reqs":1}]}`, wantErr: "element 1: missing dp_rank"},
		{name: "duplicate dp_rank", body: `{"loads":[{"dp_rank":0},{"dp_rank":0}]}`, wantErr: "duplicate dp_rank 0"},
		{name: "dp_rank out of range", body: `{"loads":[{"dp_rank":5000}]}`, wantErr: "out of range"},
		{name: "rank not an object", body: `{"loads":[3]}`, wantErr: "cannot decode"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := DecodeLoads([]byte(tt.body), recvAt)
			checkReports(t, got, err, tt.want, tt.wantErr)
		})
	}
}

func TestDecodeGetLoad(t *testing.T) {
	basic := HasRunning | HasWaiting | HasUsedTokens
	tests := []struct {
		name    string
		body    string
		want    []RankReport
		wantErr string
	}{
		{
			name: "two ranks",
			body: `[{"dp_rank":0,"num_reqs":5,"num_waiting_reqs":2,"num_tokens":900},{"dp_rank":1,"num_reqs":0,"num_waiting_reqs":0,"num_tokens":0}]`,
			want: []RankReport{
				{DPRank: 0, Fields: basic, Running: 3, Waiting: 2, UsedTokens: 900, At: recvAt},
				{DPRank: 1, Fields: basic, At: recvAt},
			},
		},
		{
			name: "running clamped at zero",
			body: `[{"dp_rank":0,"num_reqs":1,"num_waiting_reqs":4,"num_tokens":10}]`,
			want: []RankReport{{Fields: basic, Waiting: 4, UsedTokens: 10, At: recvAt}},
		},
		{
			name: "lone rank without dp_rank, unknown keys",
			body: `[{"num_reqs":2,"num_waiting_reqs":0,"num_tokens":3,"extra":{}}]`,
			want: []RankReport{{Fields: basic, Running: 2, UsedTokens: 3, At: recvAt}},
		},
		{
			name: "absent keys leave fields unset",
			body: `[{"dp_rank":0,"num_tokens":7}]`,
			want: []RankReport{{Fields: HasUsedTokens, UsedTokens: 7, At: recvAt}},
		},
		{name: "object body", body: `{"dp_rank":0}`, wantErr: "cannot decode /get_load body"},
		{name: "empty", body: `[]`, wantErr: "no DP ranks"},
		{name: "bool count", body: `[{"dp_rank":0,"num_reqs":true}]`, wantErr: "not a number"},
		{name: "duplicate", body: `[{"dp_rank":1},{"dp_rank":1}]`, wantErr: "duplicate dp_rank 1"},
		{name: "truncated", body: `[{"dp_rank":0`, wantErr: "cannot decode"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := DecodeGetLoad([]byte(tt.body), recvAt)
			checkReports(t, got, err, tt.want, tt.wantErr)
		})
	}
}

// TestLoadsBodyRoundTrip checks that what the mock engine encodes is what the decoders read.
func TestLoadsBodyRoundTrip(t *testing.T) {
	at := recvAt.Add(-300 * time.Millisecond)
	reps := []RankReport{
		{DPRank: 0, Running: 4, Waiting: 1, UsedTokens: 4000, MaxTotalTokens: 50000, WaitingUncachedTokens: 512,
			TotalTokens: 4600, MaxRunningRequests: 32, HasCounters: true, TotalPrefillUncached: 9000, TotalPrefillBusyUs: 1500},
		{DPRank: 1, Running: 0, Waiting: 0, MaxTotalTokens: 50000},
	}
	body, err := json.Marshal(NewLoadsBody(at, "test", reps))
	if err != nil {
		t.Fatal(err)
	}
	got, err := DecodeLoads(body, recvAt)
	if err != nil {
		t.Fatal(err)
	}
	for i := range reps {
		want := reps[i]
		want.Fields = HasNative | HasRunning | HasWaiting | HasUsedTokens | HasWaitingUncached | HasCapacity
		if d := got[i].At.Sub(at); d < -time.Microsecond || d > time.Microsecond {
			t.Errorf("rank %d: At = %v, want %v", i, got[i].At, at)
		}
		got[i].At = time.Time{}
		if got[i] != want {
			t.Errorf("rank %d:\n got %+v\nwant %+v", i, got[i], want)
		}
	}

	legacy := make([]GetLoadRank, len(reps))
	for i := range reps {
		legacy[i] = NewGetLoadRank(&reps[i])
	}
	body, err = json.Marshal(legacy)
	if err != nil {
		t.Fatal(err)
	}
	got, err = DecodeGetLoad(body, recvAt)
	if err != nil {
		t.Fatal(err)
	}
	for i := range reps {
		want := RankReport{DPRank: reps[i].DPRank, Fields: HasRunning | HasWaiting | HasUsedTokens,
			Running: reps[i].Running, Waiting: reps[i].Waiting, UsedTokens: reps[i].UsedTokens, At: recvAt}
		if got[i] != want {
			t.Errorf("legacy rank %d:\n got %+v\nwant %+v", i, got[i], want)
		}
	}
}

func jsonFloat(t time.Time) string {
	b, _ := json.Marshal(float64(t.UnixNano()) / 1e9)
	return string(b)
}

// checkReports compares decoded reports, allowing a microsecond of float rounding in At.
func checkReports(t *testing.T, got []RankReport, err error, want []RankReport, wantErr string) {
	t.Helper()
	if wantErr != "" {
		if err == nil {
			t.Fatalf("got %+v, want error containing %q", got, wantErr)
		}
		if !errors.Is(err, ErrMalformed) || !strings.Contains(err.Error(), wantErr) {
			t.Fatalf("error %q: want ErrMalformed containing %q", err, wantErr)
		}
		if !strings.HasPrefix(err.Error(), "cannot decode ") {
			t.Fatalf("error %q does not start with \"cannot decode \"", err)
		}
		return
	}
	if err != nil {
		t.Fatalf("unexpected error: %v", err)
	}
	if len(got) != len(want) {
		t.Fatalf("got %d reports, want %d", len(got), len(want))
	}
	for i := range want {
		g, w := got[i], want[i]
		if d := g.At.Sub(w.At); d < -time.Microsecond || d > time.Microsecond {
			t.Errorf("report %d: At = %v, want %v", i, g.At, w.At)
		}
		g.At, w.At = time.Time{}, time.Time{}
		if g != w {
			t.Errorf("report %d:\n got %+v\nwant %+v", i, g, w)
		}
	}
}
