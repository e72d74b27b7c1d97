package httpfront

import (
	"net"
	"strings"
	"testing"
	"time"

	"switchyard/config"
)

// TestStreamEndlessLine: an engine whose stream is one line that does not end (no newline)
// costs the router at most maxEventBytes held: past it the event's bytes are written through
// to the client as they come (a relay holding them would give the client nothing of them),
// and a timeout ends the stream (here server.stream_idle_timeout once the engine goes
// silent, still mid-line; server.request_timeout for one that keeps sending).
func TestStreamEndlessLine(t *testing.T) {
	const sent = 3 * maxEventBytes
	block := strings.Repeat("x", 64<<10)
	release := make(chan struct{})
	defer close(release)
	e := newRawEngine(t, func(c net.Conn) {
		if _, err := c.Write([]byte(sseHead + chunked(`data: {"id":"c0","choices":[{"index":0,"delta":{"content":"`))); err != nil {
			return
		}
		for range sent / len(block) {
			if _, err := c.Write([]byte(chunked(block))); err != nil {
				return
			}
		}
		<-release
	})
	cfg := baseConfig()
	cfg.Workers = []config.Worker{plainWorker("A", e.url, "llama")}
	cfg.Models = map[string]config.Model{"llama": {Buckets: []config.Bucket{plainBucket("all", nil, nil, "A")}}}
	cfg.Server.StreamIdleTimeout = 5 * time.Second // long: a loaded machine under -race relays slowly
	ts := startServer(t, cfg, Options{SkipStartupChecks: true, NoTelemetry: true})
	resp, err := testClient.Post(ts.url+"/v1/chat/completions", "application/json", strings.NewReader(chatBody("llama", "hi", `"stream":true`)))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	// Read it all, keeping the count and the tail only.
	var n int
	tail := make([]byte, 0, 1<<10)
	buf := make([]byte, 64<<10)
	for {
		k, err := resp.Body.Read(buf)
		n += k
		tail = append(tail, buf[:k]...)
		tail = tail[max(0, len(tail)-512):]
		if err != nil {
			break
		}
	}
	if n < sent-maxEventBytes {
		t.Fatalf("the client got %d of the %d bytes of the unfinished event: the relay held more than %d; tail %q", n, sent, maxEventBytes, tail)
	}
	if !strings.Contains(string(tail), CodeStreamIdleTimeout) || !strings.HasSuffix(string(tail), "data: [DONE]\n\n") {
		t.Fatalf("the stream did not end with the idle timeout: %q", tail)
	}
}
