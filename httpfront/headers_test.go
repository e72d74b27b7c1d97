package httpfront

import (
	"bufio"
	"strings"
	"testing"

	"github.com/valyala/fasthttp"
)

func TestSkipResponseHeader(t *testing.T) {
	tests := []struct {
		name string
		want bool
	}{
		{"Date", true}, {"date", true}, {"Server", true}, {"SERVER", true},
		{"Connection", true}, {"Keep-Alive", true}, {"keep-alive", true},
		{"Content-Length", true}, {"content-length", true}, {"Transfer-Encoding", true},
		{"Content-Type", false}, {"X-Worker-Id", false}, {"Dates", false}, {"Keep-Alivf", false},
	}
	for _, tt := range tests {
		if got := skipResponseHeader([]byte(tt.name)); got != tt.want {
			t.Errorf("skipResponseHeader(%q) = %v, want %v", tt.name, got, tt.want)
		}
	}
}

// TestCopyResponseHeaders: an engine's end-to-end headers reach the client as sent; its
// framing, connection and identity headers do not.
func TestCopyResponseHeaders(t *testing.T) {
	raw := "HTTP/1.1 200 OK\r\nServer: engine\r\nDate: Thu, 03 Dec 2026 17:40:12 GMT\r\n" +
		"Content-Type: application/json; charset=utf-8\r\nContent-Length: 2\r\nX-Worker-Id: w7\r\n" +
		"Keep-Alive: timeout=5\r\nCache-Control: no-store\r\n\r\n{}"
	var resp fasthttp.Response
	if err := resp.Read(bufio.NewReader(strings.NewReader(raw))); err != nil {
		t.Fatal(err)
	}
	var dst fasthttp.ResponseHeader
	copyResponseHeaders(&dst, &resp)
	want := map[string]string{"Content-Type": "application/json; charset=utf-8", "X-Worker-Id": "w7",
		"Cache-Control": "no-store", "Keep-Alive": "", "Date": "", "Server": ""}
	for k, v := range want {
		if got := string(dst.Peek(k)); got != v {
			t.Errorf("%s = %q, want %q", k, got, v)
		}
	}
	if got := dst.ContentLength(); got != 0 {
		t.Errorf("Content-Length %d, want 0 (the client response's own)", got)
	}
}
