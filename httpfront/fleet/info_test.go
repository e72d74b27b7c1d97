package fleet

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"switchyard/kv/subscribe"
)

func TestDecodeInfo(t *testing.T) {
	tests := []struct {
		name    string
		body    string
		want    Info
		kv      *KVInfo
		kvErr   bool
		labels  map[string]string
		wantErr bool
	}{
		{name: "sglang prefill", body: `{"model_path":"/m/llama","served_model_name":null,"disaggregation_mode":"prefill",
			"disaggregation_bootstrap_port":"8998","dp_size":2,"page_size":16,
			"kv_events":{"publisher":"zmq","endpoint_host":"*","endpoint_port_base":5557,"load_endpoint_port_base":5600,"block_size":16,"dp_size":2}}`,
			want:   Info{ModelPath: "/m/llama", Mode: "prefill", BootstrapPort: 8998, DPSize: 2, PageSize: 16},
			kv:     &KVInfo{Publisher: "zmq", Host: "*", PortBase: 5557, ReplayHost: "*", BlockSize: 16, DPSize: 2, LoadPortBase: 5600},
			labels: map[string]string{"page_size": "16"}},
		{name: "PD compatibility labels, as SGLang's server arguments name them", body: `{"model_path":"m","disaggregation_mode":"decode",
			"page_size":64,"disaggregation_transfer_backend":"nixl","kv_cache_dtype":"fp8_e4m3","tp_size":"4"}`,
			want:   Info{ModelPath: "m", Mode: "decode", PageSize: 64},
			labels: map[string]string{"transfer_backend": "nixl", "kv_cache_dtype": "fp8_e4m3", "tp_size": "4", "page_size": "64"}},
		{name: "null labels are absent", body: `{"model_path":"m","disaggregation_transfer_backend":null,"tp_size":null,"kv_cache_dtype":""}`,
			want: Info{ModelPath: "m"}},
		{name: "port base as a string", body: `{"served_model_name":"qwen","disaggregation_mode":"null","dp_size":"1",
			"kv_events":{"publisher":"zmq","endpoint_port_base":"5557","dp_size":"1"}}`,
			want: Info{ServedModelName: "qwen", DPSize: 1},
			kv:   &KVInfo{Publisher: "zmq", PortBase: 5557, DPSize: 1}},
		{name: "single-string endpoint form", body: `{"model_path":"m","kv_events":{"endpoint":"tcp://*:5557","replay_endpoint":"tcp://0.0.0.0:5560","topic":"kv"}}`,
			want: Info{ModelPath: "m"},
			kv:   &KVInfo{Host: "*", PortBase: 5557, ReplayHost: "0.0.0.0", ReplayPortBase: 5560, Topic: "kv"}},
		{name: "engine config as a JSON string", body: `{"model_path":"m","kv_events":null,"kv_events_config":"{\"publisher\":\"zmq\",\"endpoint\":\"tcp://*:6000\",\"replay_endpoint\":null}"}`,
			want: Info{ModelPath: "m"},
			kv:   &KVInfo{Publisher: "zmq", Host: "*", PortBase: 6000, ReplayHost: "*"}},
		{name: "served model name list", body: `{"model_path":"/p","served_model_name":["alias","other"]}`,
			want: Info{ModelPath: "/p", ServedModelName: "alias"}},
		{name: "integral float and padded string", body: `{"model_path":"m","dp_size":2.0,"page_size":" 32 "}`,
			want: Info{ModelPath: "m", DPSize: 2, PageSize: 32}, labels: map[string]string{"page_size": "32"}},
		{name: "mode in capitals", body: `{"model_path":"m","disaggregation_mode":"Decode"}`, want: Info{ModelPath: "m", Mode: "decode"}},
		{name: "top-level load endpoint", body: `{"model_path":"m","load_publish_endpoint":"tcp://*:7000"}`,
			want: Info{ModelPath: "m", LoadEndpoint: "tcp://*:7000"}},
		{name: "unreadable kv section keeps the worker", body: `{"model_path":"m","kv_events":{"endpoint_port_base":"x"}}`,
			want: Info{ModelPath: "m"}, kvErr: true},
		{name: "kv ports past the range", body: `{"model_path":"m","kv_events":{"endpoint_port_base":65530,"dp_size":8}}`,
			want: Info{ModelPath: "m"}, kvErr: true},
		{name: "not an object", body: `[]`, wantErr: true},
		{name: "not JSON", body: `{`, wantErr: true},
		{name: "unknown mode", body: `{"disaggregation_mode":"weird"}`, wantErr: true},
		{name: "negative dp size", body: `{"dp_size":-1}`, wantErr: true},
		{name: "port not a number", body: `{"disaggregation_bootstrap_port":"x"}`, wantErr: true},
		{name: "port out of range", body: `{"disaggregation_bootstrap_port":70000}`, wantErr: true},
		{name: "fractional page size", body: `{"page_size":1.5}`, wantErr: true},
		{name: "model path not a string", body: `{"model_path":7}`, wantErr: true},
		{name: "transfer backend not a string", body: `{"disaggregation_transfer_backend":7}`, wantErr: true},
		{name: "kv cache dtype not a string", body: `{"kv_cache_dtype":["a"]}`, wantErr: true},
		{name: "negative tp size", body: `{"tp_size":-2}`, wantErr: true},
		{name: "tp size not a number", body: `{"tp_size":"x"}`, wantErr: true},
		{name: "label past its bound", body: `{"kv_cache_dtype":"` + strings.Repeat("x", 300) + `"}`, wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			info, err := DecodeInfo([]byte(tt.body))
			if tt.wantErr {
				if !errors.Is(err, ErrIntrospection) {
					t.Fatalf("err = %v, want ErrIntrospection", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			gotKV, gotKVErr, gotLabels := info.KV, info.KVErr, info.Labels
			info.KV, info.KVErr, info.Labels = nil, nil, nil
			if !maps.Equal(gotLabels, tt.labels) {
				t.Errorf("labels %v, want %v", gotLabels, tt.labels)
			}
			if !reflect.DeepEqual(info, tt.want) {
				t.Errorf("info %+v, want %+v", info, tt.want)
			}
			if (gotKVErr != nil) != tt.kvErr {
				t.Errorf("kv error %v, want one: %v", gotKVErr, tt.kvErr)
			}
			switch {
			case tt.kv == nil && gotKV != nil:
				t.Errorf("kv %+v, want none", *gotKV)
			case tt.kv != nil && (gotKV == nil || *gotKV != *tt.kv):
				t.Errorf("kv %+v, want %+v", gotKV, *tt.kv)
			}
		})
	}
}

func TestInfoKVDiscovery(t *testing.T) {
	tests := []struct {
		name    string
		body    string
		url     string
		want    []subscribe.Publisher
		bs, dp  int
		wantErr error
	}{
		{name: "wildcard host, two ranks, replay",
			body: `{"page_size":16,"dp_size":2,"kv_events":{"publisher":"zmq","endpoint_host":"*","endpoint_port_base":5557,"topic":"kv","block_size":32,"dp_size":2,"replay_endpoint_port_base":6000}}`,
			url:  "http://10.0.0.7:30000",
			want: []subscribe.Publisher{{Rank: 0, Endpoint: "tcp://10.0.0.7:5557", Replay: "tcp://10.0.0.7:6000", Topic: "kv"}, {Rank: 1, Endpoint: "tcp://10.0.0.7:5558", Replay: "tcp://10.0.0.7:6001", Topic: "kv"}},
			bs:   32, dp: 2},
		{name: "numbers as strings, explicit host",
			body: `{"page_size":"64","kv_events":{"endpoint_host":"engine-1","endpoint_port_base":"7000"}}`,
			url:  "http://127.0.0.1:1",
			want: []subscribe.Publisher{{Rank: 0, Endpoint: "tcp://engine-1:7000"}}, bs: 64, dp: 1},
		{name: "endpoint form and replay endpoint, IPv6 worker",
			body: `{"kv_events":{"endpoint":"tcp://*:5557","replay_endpoint":"tcp://*:5560","block_size":16}}`,
			url:  "http://[::1]:8000",
			want: []subscribe.Publisher{{Rank: 0, Endpoint: "tcp://[::1]:5557", Replay: "tcp://[::1]:5560"}}, bs: 16, dp: 1},
		{name: "top-level dp size raises the ranks",
			body: `{"dp_size":"2","kv_events":{"endpoint_port_base":5557}}`, url: "http://h:1",
			want: []subscribe.Publisher{{Rank: 0, Endpoint: "tcp://h:5557"}, {Rank: 1, Endpoint: "tcp://h:5558"}}, dp: 2},
		{name: "no kv_events", body: `{"page_size":16}`, wantErr: subscribe.ErrNoKVEvents},
		{name: "null kv_events", body: `{"kv_events":null}`, wantErr: subscribe.ErrNoKVEvents},
		{name: "another publisher", body: `{"kv_events":{"publisher":"null","load_endpoint_port_base":5600}}`, wantErr: subscribe.ErrNoKVEvents},
		{name: "no port", body: `{"kv_events":{"publisher":"zmq"}}`, wantErr: subscribe.ErrNoKVEvents},
		{name: "unreadable section", body: `{"kv_events":"zmq"}`, wantErr: subscribe.ErrNoKVEvents},
		{name: "top-level ranks past the port range", body: `{"dp_size":8,"kv_events":{"endpoint_port_base":65530}}`, wantErr: subscribe.ErrNoKVEvents},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			info, err := DecodeInfo([]byte(tt.body))
			if err != nil {
				t.Fatal(err)
			}
			d, err := info.KVDiscovery(tt.url)
			if tt.wantErr != nil {
				if !errors.Is(err, tt.wantErr) {
					t.Fatalf("err = %v, want %v", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if fmt.Sprint(d.Publishers) != fmt.Sprint(tt.want) || d.BlockSize != tt.bs || d.DPSize != tt.dp {
				t.Fatalf("got %+v, want %v bs %d dp %d", d, tt.want, tt.bs, tt.dp)
			}
		})
	}
}

func TestGaugeEndpoints(t *testing.T) {
	tests := []struct {
		name, body, url, want string
	}{
		{"kv section port base per rank", `{"dp_size":2,"kv_events":{"endpoint_host":"*","load_endpoint_port_base":5600}}`,
			"http://10.1.2.3:30000", "tcp://10.1.2.3:5600,tcp://10.1.2.3:5601"},
		{"a publisher the router cannot read still has a gauge", `{"kv_events":{"publisher":"null","endpoint_host":"0.0.0.0","load_endpoint_port_base":"5600"}}`,
			"http://engine:1", "tcp://engine:5600"},
		{"top-level endpoint", `{"load_publish_endpoint":"tcp://[::]:7000"}`, "http://h:1", "tcp://h:7000"},
		{"explicit host", `{"kv_events":{"endpoint_host":"10.9.9.9","load_endpoint_port_base":5600}}`, "http://h:1", "tcp://10.9.9.9:5600"},
		{"none", `{"kv_events":{"endpoint_port_base":5557}}`, "http://h:1", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			info, err := DecodeInfo([]byte(tt.body))
			if err != nil {
				t.Fatal(err)
			}
			if got := strings.Join(info.GaugeEndpoints(tt.url), ","); got != tt.want {
				t.Fatalf("gauges %q, want %q", got, tt.want)
			}
		})
	}
}

// FuzzDecodeInfo: the decoder never panics, and what it accepts yields publishers and
// gauges within range.
func FuzzDecodeInfo(f *testing.F) {
	f.Add([]byte(`{"model_path":"m","disaggregation_mode":"prefill","disaggregation_bootstrap_port":8998,"dp_size":2,"kv_events":{"endpoint_host":"*","load_endpoint_port_base":1}}`), "http://127.0.0.1:30000")
	f.Add([]byte(`{"kv_events":{"endpoint":"tcp://*:5557","replay_endpoint":null}}`), "http://localhost")
	f.Add([]byte(`{"kv_events":"zmq"}`), "")
	f.Add([]byte(`{"model_path":"m","disaggregation_transfer_backend":"nixl","kv_cache_dtype":"auto","tp_size":8,"page_size":64}`), "")
	f.Fuzz(func(t *testing.T, body []byte, url string) {
		info, err := DecodeInfo(body)
		if err != nil {
			return
		}
		if info.DPSize < 0 || info.DPSize > maxDPSize || info.BootstrapPort < 0 || info.BootstrapPort > 65535 || info.PageSize < 0 {
			t.Fatalf("%+v", info)
		}
		for k, v := range info.Labels {
			if v == "" || len(v) > maxLabelValue {
				t.Fatalf("label %s=%q", k, v)
			}
		}
		for _, ep := range info.GaugeEndpoints(url) {
			if _, _, err := subscribe.SplitEndpoint(ep); err != nil {
				t.Fatalf("gauge endpoint %q: %v", ep, err)
			}
		}
		d, err := info.KVDiscovery(url)
		if err != nil {
			return
		}
		if len(d.Publishers) != d.DPSize || d.DPSize < 1 || d.DPSize > maxDPSize {
			t.Fatalf("%d publishers for dp %d", len(d.Publishers), d.DPSize)
		}
		for _, p := range d.Publishers {
			if _, _, err := subscribe.SplitEndpoint(p.Endpoint); err != nil {
				t.Fatalf("publisher endpoint %q: %v", p.Endpoint, err)
			}
		}
	})
}

// infoEngine answers the introspection routes with the given statuses and bodies.
func infoEngine(t *testing.T, routes map[string]func(w http.ResponseWriter)) string {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if h := routes[r.URL.Path]; h != nil {
			h(w)
			return
		}
		http.NotFound(w, r)
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

func TestIntrospect(t *testing.T) {
	client := &fasthttp.Client{}
	t.Cleanup(client.CloseIdleConnections)
	ok := func(body string) func(http.ResponseWriter) {
		return func(w http.ResponseWriter) { fmt.Fprint(w, body) }
	}
	status := func(code int) func(http.ResponseWriter) {
		return func(w http.ResponseWriter) { w.WriteHeader(code) }
	}
	tests := []struct {
		name    string
		routes  map[string]func(http.ResponseWriter)
		model   string
		wantErr error
	}{
		{"newer route", map[string]func(http.ResponseWriter){PathServerInfo: ok(`{"model_path":"new"}`)}, "new", nil},
		{"older route when the newer one fails", map[string]func(http.ResponseWriter){
			PathServerInfo: status(500), PathGetServerInfo: ok(`{"model_path":"old"}`)}, "old", nil},
		{"no route at all (vLLM)", nil, "", ErrNoIntrospection},
		{"failing engine", map[string]func(http.ResponseWriter){PathServerInfo: status(503), PathGetServerInfo: status(503)}, "", ErrIntrospection},
		{"unreadable body", map[string]func(http.ResponseWriter){PathServerInfo: ok(`{"dp_size":"x"}`)}, "", ErrIntrospection},
		{"body over the limit", map[string]func(http.ResponseWriter){PathServerInfo: ok(`{"model_path":"` + strings.Repeat("x", maxInfoBody) + `"}`)}, "", ErrIntrospection},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			url := infoEngine(t, tt.routes)
			info, err := Introspect(context.Background(), client, url+"/", 5*time.Second)
			if tt.wantErr != nil {
				if !errors.Is(err, tt.wantErr) {
					t.Fatalf("err = %v, want %v", err, tt.wantErr)
				}
				if tt.wantErr == ErrIntrospection && errors.Is(err, ErrNoIntrospection) {
					t.Fatalf("a failing engine is not one without introspection: %v", err)
				}
				return
			}
			if err != nil || info.Model() != tt.model {
				t.Fatalf("info %+v, err %v", info, err)
			}
		})
	}
}

func TestKVDiscoverer(t *testing.T) {
	client := &fasthttp.Client{}
	t.Cleanup(client.CloseIdleConnections)
	d := &KVDiscoverer{Client: client, Timeout: 5 * time.Second}
	url := infoEngine(t, map[string]func(http.ResponseWriter){PathServerInfo: func(w http.ResponseWriter) {
		fmt.Fprint(w, `{"page_size":16,"kv_events":{"endpoint_host":"0.0.0.0","endpoint_port_base":"5557"}}`)
	}})
	got, err := d.DiscoverKV(context.Background(), url)
	if err != nil || len(got.Publishers) != 1 || got.Publishers[0].Endpoint != "tcp://127.0.0.1:5557" || got.BlockSize != 16 {
		t.Fatalf("%+v, %v", got, err)
	}
	if _, err := d.DiscoverKV(context.Background(), infoEngine(t, nil)); !errors.Is(err, subscribe.ErrNoKVEvents) {
		t.Fatalf("engine without introspection: %v, want ErrNoKVEvents", err)
	}
}
