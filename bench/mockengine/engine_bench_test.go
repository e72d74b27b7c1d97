package mockengine

import (
	"encoding/json"
	"net"
	"strings"
	"testing"

	"github.com/valyala/fasthttp"
)

// BenchmarkEngineZeroCost measures the mock engine's own throughput for short
// non-streaming requests with simulated costs set to zero, over real loopback HTTP, so
// benchmark reports can show that the engines were not the bottleneck. The baseline is a
// fasthttp server answering a fixed body to the same client: the harness's ceiling.
func BenchmarkEngineZeroCost(b *testing.B) {
	chat, _ := json.Marshal(map[string]any{
		"model": "m", "max_tokens": 8,
		"messages": []map[string]any{{"role": "system", "content": longText(60)}, {"role": "user", "content": "What is a prefix cache?"}},
	})
	gen, _ := json.Marshal(map[string]any{"input_ids": ids(1, 256), "sampling_params": map[string]any{"max_new_tokens": 8}})
	cases := []struct {
		name  string
		cfg   Config
		route string
		body  []byte
	}{
		{"chat", Config{ZeroCost: true}, "/v1/chat/completions", chat},
		{"chat/no-publishers", Config{ZeroCost: true, KVEvents: KVEvents{Disabled: true}, LoadPublish: LoadPublish{Disabled: true}}, "/v1/chat/completions", chat},
		{"generate-256-ids", Config{ZeroCost: true}, "/generate", gen},
	}
	for _, bc := range cases {
		b.Run(bc.name, func(b *testing.B) {
			e, err := Start(b.Context(), bc.cfg)
			if err != nil {
				b.Fatal(err)
			}
			defer e.Close()
			runLoad(b, strings.TrimPrefix(e.URL(), "http://"), bc.route, bc.body)
		})
	}
	b.Run("baseline-static-fasthttp", func(b *testing.B) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			b.Fatal(err)
		}
		body := []byte(`{"id":"x","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"the cat"},"finish_reason":"length"}],"usage":{"prompt_tokens":90,"completion_tokens":8,"total_tokens":98}}`)
		srv := &fasthttp.Server{Handler: func(ctx *fasthttp.RequestCtx) {
			ctx.SetContentType("application/json")
			ctx.SetBody(body)
		}}
		go func() { _ = srv.Serve(ln) }()
		defer srv.Shutdown()
		runLoad(b, ln.Addr().String(), "/v1/chat/completions", chat)
	})
}

func runLoad(b *testing.B, addr, route string, body []byte) {
	hc := &fasthttp.HostClient{Addr: addr, MaxConns: 256}
	defer hc.CloseIdleConnections()
	url := "http://" + addr + route
	b.ReportAllocs()
	b.SetParallelism(8)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
		defer fasthttp.ReleaseRequest(req)
		defer fasthttp.ReleaseResponse(resp)
		req.SetRequestURI(url)
		req.Header.SetMethod("POST")
		req.Header.SetContentType("application/json")
		req.SetBody(body)
		for pb.Next() {
			if err := hc.Do(req, resp); err != nil {
				b.Error(err)
				return
			}
			if resp.StatusCode() != 200 {
				b.Errorf("status %d: %s", resp.StatusCode(), resp.Body())
				return
			}
		}
	})
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "req/s")
}
