package rawtest

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
)

// TestServeOneRequest: a request sent to a OneRequest handler reaches its answer after the
// request's body was read, on a connection closed when the answer returns; a peer that sends
// no request gets nothing.
func TestServeOneRequest(t *testing.T) {
	addr := Serve(t, OneRequest(func(c net.Conn) {
		_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
	}))
	resp, err := http.Post("http://"+addr+"/v1/completions", "application/json", strings.NewReader(`{"prompt":"x"}`))
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || resp.StatusCode != 200 || string(body) != "ok" {
		t.Fatalf("%d %q %v", resp.StatusCode, body, err)
	}

	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := io.WriteString(c, "not http\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	if n, err := bufio.NewReader(c).Read(make([]byte, 1)); n != 0 || err != io.EOF {
		t.Fatalf("read %d bytes, %v; want the connection closed unanswered", n, err)
	}
}
