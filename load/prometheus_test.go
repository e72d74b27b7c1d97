package load

import (
	"errors"
	"os"
	"reflect"
	"strings"
	"testing"
)

func readTestdata(t testing.TB, name string) []byte {
	t.Helper()
	b, err := os.ReadFile("testdata/" + name)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

const native = HasRunning | HasWaiting | HasCapacity | HasUsedTokens | HasNative

func TestDecodePrometheus(t *testing.T) {
	vllm1 := string(readTestdata(t, "vllm_metrics.txt"))
	vllm2 := string(readTestdata(t, "vllm_metrics_dp2.txt"))
	sgl := string(readTestdata(t, "sglang_metrics.txt"))
	const cfg = `vllm:cache_config_info{block_size="16",engine="0",num_gpu_blocks="1000"} 1.0` + "\n"
	tests := []struct {
		name     string
		body     string
		model    string
		want     []RankReport
		wantInfo PrometheusInfo
		wantErr  string
	}{
		{
			name: "vllm page of one engine",
			body: vllm1,
			want: []RankReport{{Fields: native, Running: 3, Waiting: 2, MaxTotalTokens: 4096 * 16, UsedTokens: 28672, At: recvAt}},
			wantInfo: PrometheusInfo{Flavor: FlavorVLLM, Model: "Qwen/Qwen3-8B", Preemptions: 7,
				CacheHitRate: 6.2e6 / 9.1e6},
		},
		{
			name: "vllm page of two DP engines",
			body: vllm2,
			want: []RankReport{
				{DPRank: 0, Fields: native, Running: 3, Waiting: 2, MaxTotalTokens: 65536, UsedTokens: 28672, At: recvAt},
				{DPRank: 1, Fields: native, Running: 5, Waiting: 0, MaxTotalTokens: 65536, UsedTokens: 8192, At: recvAt},
			},
			wantInfo: PrometheusInfo{Flavor: FlavorVLLM, Model: "Qwen/Qwen3-8B", Preemptions: 14,
				CacheHitRate: 6.2e6 / 9.1e6},
		},
		{
			name: "older vllm: gpu_cache_usage_perc, cache_config_info without engine label",
			body: "vllm:num_requests_running{model_name=\"m\"} 1.0\nvllm:num_requests_waiting{model_name=\"m\"} 4.0\n" +
				"vllm:gpu_cache_usage_perc{model_name=\"m\"} 0.5\n" +
				`vllm:cache_config_info{block_size="16",num_gpu_blocks="100",num_cpu_blocks="None"} 1.0` + "\n",
			want:     []RankReport{{Fields: native, Running: 1, Waiting: 4, MaxTotalTokens: 1600, UsedTokens: 800, At: recvAt}},
			wantInfo: PrometheusInfo{Flavor: FlavorVLLM, Model: "m", Preemptions: -1, CacheHitRate: -1},
		},
		{
			name: "kv_cache_size_tokens label wins over blocks",
			body: "vllm:num_requests_running 1\nvllm:num_requests_waiting 0\nvllm:kv_cache_usage_perc 0.25\n" +
				`vllm:cache_config_info{block_size="16",num_gpu_blocks="100",kv_cache_size_tokens="2000"} 1` + "\n",
			want:     []RankReport{{Fields: native, Running: 1, MaxTotalTokens: 2000, UsedTokens: 500, At: recvAt}},
			wantInfo: PrometheusInfo{Flavor: FlavorVLLM, Preemptions: -1, CacheHitRate: -1},
		},
		{
			name:     "vllm without capacity is not native",
			body:     "vllm:num_requests_running 2\nvllm:num_requests_waiting 1\nvllm:kv_cache_usage_perc 0.3\n",
			want:     []RankReport{{Fields: HasRunning | HasWaiting, Running: 2, Waiting: 1, At: recvAt}},
			wantInfo: PrometheusInfo{Flavor: FlavorVLLM, Preemptions: -1, CacheHitRate: -1},
		},
		{
			name: "several models: the configured one is read",
			body: "vllm:num_requests_running{model_name=\"a\",engine=\"0\"} 1\nvllm:num_requests_running{model_name=\"b\",engine=\"0\"} 9\n" +
				"vllm:num_requests_waiting{model_name=\"a\",engine=\"0\"} 2\nvllm:num_requests_waiting{model_name=\"b\",engine=\"0\"} 8\n" + cfg,
			model:    "b",
			want:     []RankReport{{Fields: HasRunning | HasWaiting | HasCapacity | HasNative, Running: 9, Waiting: 8, MaxTotalTokens: 16000, At: recvAt}},
			wantInfo: PrometheusInfo{Flavor: FlavorVLLM, Model: "b", Preemptions: -1, CacheHitRate: -1},
		},
		{
			name:    "several models, none configured",
			body:    "vllm:num_requests_running{model_name=\"a\"} 1\nvllm:num_requests_running{model_name=\"b\"} 9\n",
			model:   "c",
			wantErr: `serves models ["a" "b"] and none is "c"`,
		},
		{
			name: "sglang page: tp_rank 0 speaks",
			body: sgl,
			want: []RankReport{{Fields: native, Running: 12, Waiting: 3, UsedTokens: 40561, MaxTotalTokens: 144870, At: recvAt}},
			wantInfo: PrometheusInfo{Flavor: FlavorSGLang, Model: "meta-llama/Llama-3.1-8B-Instruct", Preemptions: -1,
				CacheHitRate: 0.4375},
		},
		{
			name: "sglang DP ranks, used from token_usage",
			body: "sglang:num_running_reqs{dp_rank=\"1\"} 4\nsglang:num_running_reqs{dp_rank=\"0\"} 1\n" +
				"sglang:num_queue_reqs{dp_rank=\"0\"} 0\nsglang:num_queue_reqs{dp_rank=\"1\"} 2\n" +
				"sglang:max_total_num_tokens{dp_rank=\"0\"} 1000\nsglang:max_total_num_tokens{dp_rank=\"1\"} 1000\n" +
				"sglang:token_usage{dp_rank=\"0\"} 0.5\nsglang:token_usage{dp_rank=\"1\"} 0.25\n",
			want: []RankReport{
				{DPRank: 0, Fields: native, Running: 1, UsedTokens: 500, MaxTotalTokens: 1000, At: recvAt},
				{DPRank: 1, Fields: native, Running: 4, Waiting: 2, UsedTokens: 250, MaxTotalTokens: 1000, At: recvAt},
			},
			wantInfo: PrometheusInfo{Flavor: FlavorSGLang, Preemptions: -1, CacheHitRate: -1},
		},
		{
			name:     "a broken line of a metric the router does not read is skipped",
			body:     "# HELP x\nhttp_requests_total{handler=\"/x\" 1\nvllm:num_requests_running 2\n\x00garbage\n",
			want:     []RankReport{{Fields: HasRunning, Running: 2, At: recvAt}},
			wantInfo: PrometheusInfo{Flavor: FlavorVLLM, Preemptions: -1, CacheHitRate: -1},
		},
		{name: "empty page", body: "", wantErr: "none of the vllm: or sglang: load metrics"},
		{name: "unrelated page", body: "go_goroutines 12\nprocess_open_fds 3\n", wantErr: "none of the"},
		{name: "broken label set", body: "vllm:num_requests_running{engine=\"0\" 2\n", wantErr: "malformed"},
		{name: "NaN value", body: "vllm:num_requests_running NaN\n", wantErr: "not a finite non-negative number"},
		{name: "negative value", body: "sglang:num_running_reqs -1\n", wantErr: "not a finite non-negative number"},
		{name: "infinite value", body: "vllm:num_requests_waiting +Inf\n", wantErr: "not a finite"},
		{name: "only cache_config_info", body: cfg, wantErr: "no sglang:num_running_reqs"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, info, err := DecodePrometheus([]byte(tt.body), tt.model, recvAt)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) || !errors.Is(err, ErrMalformed) {
					t.Fatalf("err = %v, want one wrapping ErrMalformed containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("reports\n got %+v\nwant %+v", got, tt.want)
			}
			if info != tt.wantInfo {
				t.Errorf("info = %+v, want %+v", info, tt.wantInfo)
			}
		})
	}
}

// TestDecodePrometheusAggregates checks that prometheus reports of a DP engine aggregate
// like native ones: known only once every rank reported, summed, comparable (native).
func TestDecodePrometheusAggregates(t *testing.T) {
	reps, _, err := DecodePrometheus(readTestdata(t, "vllm_metrics_dp2.txt"), "", recvAt)
	if err != nil {
		t.Fatal(err)
	}
	a := NewAggregator(0)
	a.SetWorker("w", 2, nil)
	a.Ingest("w", reps[0])
	if o := a.Snapshot(recvAt).Observe("w", recvAt); o.Known() {
		t.Fatalf("one rank of two reported, observation %+v is known", o)
	}
	a.Ingest("w", reps[1])
	o := a.Snapshot(recvAt).Observe("w", recvAt)
	if !o.Native() || o.Running != 8 || o.Waiting != 2 || o.MaxTotalTokens != 131072 || o.UsedTokens != 36864 {
		t.Fatalf("observation %+v", o)
	}
}

func FuzzDecodePrometheus(f *testing.F) {
	f.Add(readTestdata(f, "sglang_metrics.txt"), "")
	f.Add([]byte("vllm:num_requests_running{engine=\"0\",model_name=\"m\"} 1\nvllm:num_requests_waiting{engine=\"1\"} 2e3\n"+
		`vllm:cache_config_info{block_size="16",num_gpu_blocks="9223372036854775807"} 1`+"\n"), "m")
	f.Add([]byte("vllm:kv_cache_usage_perc 1e300\nvllm:cache_config_info{kv_cache_size_tokens=\"5\"} 1\n"), "")
	f.Fuzz(func(t *testing.T, body []byte, model string) {
		reps, info, err := DecodePrometheus(body, model, recvAt)
		if err != nil {
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("error %v does not wrap ErrMalformed", err)
			}
			return
		}
		if info.Flavor != FlavorVLLM && info.Flavor != FlavorSGLang {
			t.Fatalf("flavor %q", info.Flavor)
		}
		checkDecoded(t, reps)
		for i := range reps {
			r := &reps[i]
			if r.Has(HasNative) && !r.Has(HasRunning|HasWaiting|HasCapacity) {
				t.Fatalf("rank %d native without running, waiting and capacity: %+v", i, r)
			}
			if r.Has(HasCapacity) && r.UsedTokens > r.MaxTotalTokens && info.Flavor == FlavorVLLM {
				t.Fatalf("rank %d uses more than its capacity: %+v", i, r)
			}
			if !r.At.Equal(recvAt) {
				t.Fatalf("rank %d at %v", i, r.At)
			}
		}
	})
}
