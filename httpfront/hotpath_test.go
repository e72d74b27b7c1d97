package httpfront

import (
	"bufio"
	"strings"
	"testing"

	"github.com/valyala/fasthttp"

	"switchyard/config"
)

// parseRequestHeader parses raw request headers the way the server does (names normalized).
func parseRequestHeader(t testing.TB, raw string) *fasthttp.RequestHeader {
	t.Helper()
	var h fasthttp.RequestHeader
	if err := h.Read(bufio.NewReader(strings.NewReader(raw))); err != nil {
		t.Fatal(err)
	}
	return &h
}

func TestForwardedHeaders(t *testing.T) {
	tests := []struct {
		name                     string
		session, routing, key    string
		raw                      string
		want                     map[string]string // forwarded headers; "" = must be absent
		wantSession, wantRouting string
	}{
		{
			name:    "allow-list and affinity headers, any case; the rest dropped",
			session: "x-session-id", routing: "X-SGL-Routing-Key",
			raw: "POST /v1/chat/completions HTTP/1.1\r\nHost: r\r\nx-request-id: r1\r\nTRACEPARENT: 00-a-01\r\n" +
				"Tracestate: k=v\r\nX-Correlation-Id: c1\r\nAuthorization: Bearer e\r\nx-session-id: s1\r\n" +
				"x-sgl-routing-key: rk\r\nCookie: a=b\r\nX-Custom: no\r\nConnection: keep-alive\r\n\r\n",
			want: map[string]string{"X-Request-Id": "r1", "Traceparent": "00-a-01", "Tracestate": "k=v",
				"X-Correlation-Id": "c1", "Authorization": "Bearer e", "X-Session-Id": "s1", "X-Sgl-Routing-Key": "rk",
				"Cookie": "", "X-Custom": "", "Connection": ""},
			wantSession: "s1", wantRouting: "rk",
		},
		{
			name: "the router's key is not forwarded", session: "x-session-id", key: "k1",
			raw:  "POST /generate HTTP/1.1\r\nHost: r\r\nAuthorization: Bearer k1\r\nX-Request-Id: r1\r\n\r\n",
			want: map[string]string{"Authorization": "", "X-Request-Id": "r1"},
		},
		{
			name: "first occurrence wins; empty values and unconfigured affinity headers are not forwarded",
			raw: "POST /generate HTTP/1.1\r\nHost: r\r\nX-Request-Id: first\r\nX-Request-Id: second\r\n" +
				"Traceparent:\r\nX-Session-Id: s1\r\n\r\n",
			want: map[string]string{"X-Request-Id": "first", "Traceparent": "", "X-Session-Id": ""},
		},
		{
			name: "an affinity header that is also allow-listed", session: "X-Request-Id",
			raw:         "POST /generate HTTP/1.1\r\nHost: r\r\nX-Request-Id: r1\r\n\r\n",
			want:        map[string]string{"X-Request-Id": "r1"},
			wantSession: "r1",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := config.Default()
			cfg.Server.APIKey = tt.key
			s := &Server{cfg: cfg, fwd: newForwardNames(tt.session, tt.routing)}
			var hdr clientHeaders
			s.fwd.scan(parseRequestHeader(t, tt.raw), &hdr)
			if got := hdr.string(fwdSession); got != tt.wantSession {
				t.Errorf("session key %q, want %q", got, tt.wantSession)
			}
			if got := hdr.string(fwdRouting); got != tt.wantRouting {
				t.Errorf("routing key %q, want %q", got, tt.wantRouting)
			}
			d := dispatch{s: s, kind: routeChat, hdr: hdr}
			req := fasthttp.AcquireRequest()
			defer fasthttp.ReleaseRequest(req)
			d.upstreamHeaders(req, &workerState{hostPort: "engine:30000"})
			for k, v := range tt.want {
				if got := string(req.Header.Peek(k)); got != v {
					t.Errorf("upstream %s = %q, want %q", k, got, v)
				}
			}
			if got := string(req.Header.Host()); got != "engine:30000" {
				t.Errorf("upstream Host = %q", got)
			}
			if got := len(req.Header.PeekAll("X-Request-Id")); got > 1 {
				t.Errorf("X-Request-Id forwarded %d times", got)
			}
		})
	}
}
