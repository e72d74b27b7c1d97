package engine

import (
	"testing"

	"switchyard/config"
	"switchyard/load"
)

func TestAdmissionLimits(t *testing.T) {
	full := load.Observation{
		Fields:  load.HasRunning | load.HasWaiting | load.HasUsedTokens | load.HasWaitingUncached,
		Running: 10, Waiting: 5, UsedTokens: 1000, WaitingUncachedTokens: 300,
	}
	tests := []struct {
		name     string
		limits   AdmissionLimits
		obs      load.Observation
		inflight int
		want     string
	}{
		{"default admits everything", AdmissionLimits{}, full, 100, ""},
		{"running below cap admits", AdmissionLimits{MaxRunning: 11}, full, 0, ""},
		{"running at cap rejects", AdmissionLimits{MaxRunning: 10}, full, 0, LimitRunning},
		{"waiting at cap rejects", AdmissionLimits{MaxWaiting: 5}, full, 0, LimitWaiting},
		{"waiting below cap admits", AdmissionLimits{MaxWaiting: 6}, full, 0, ""},
		{"kv at cap rejects", AdmissionLimits{MaxKVTokens: 1000}, full, 0, LimitKVTokens},
		{"pending prefill at cap rejects", AdmissionLimits{MaxPendingPrefill: 300}, full, 0, LimitPendingPrefill},
		{"pending prefill below cap admits", AdmissionLimits{MaxPendingPrefill: 301}, full, 0, ""},
		{"in-flight at cap rejects", AdmissionLimits{MaxInFlight: 3}, full, 3, LimitInFlight},
		{"in-flight below cap admits", AdmissionLimits{MaxInFlight: 3}, full, 2, ""},
		{"unknown running fails open", AdmissionLimits{MaxRunning: 1}, load.Observation{}, 0, ""},
		{"unknown pending fails open", AdmissionLimits{MaxPendingPrefill: 1}, load.Observation{Fields: load.HasRunning, Running: 0}, 0, ""},
		{"in-flight known without a report", AdmissionLimits{MaxInFlight: 1}, load.Observation{}, 1, LimitInFlight},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tr := load.NewTracker()
			w := NewWorker("w", "http://127.0.0.1:1", "m", StagePlain, tr.Counters("w"))
			inflight(t, tr, w, tt.inflight)
			if got := tt.limits.Check(w, tt.obs); got != tt.want {
				t.Fatalf("Check = %q, want %q", got, tt.want)
			}
		})
	}
}

func TestLimitsFromConfig(t *testing.T) {
	v := func(n int64) *int64 { return &n }
	got := LimitsFromConfig(config.Admission{MaxRunningRequests: v(64), MaxKVTokens: v(1048576), MaxInflightRequests: v(8)})
	want := AdmissionLimits{MaxRunning: 64, MaxKVTokens: 1048576, MaxInFlight: 8}
	if got != want {
		t.Fatalf("got %+v, want %+v", got, want)
	}
	if admissionOf(LimitsFromConfig(config.Admission{})) != nil {
		t.Fatal("an empty admission must not be checked")
	}
}
