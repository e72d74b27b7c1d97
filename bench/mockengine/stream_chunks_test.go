package mockengine

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"
)

// chunksOf sends a streaming completion of maxTokens tokens over a raw connection and
// returns the HTTP chunks of the answer's body.
func chunksOf(t *testing.T, e *Engine, maxTokens int) []string {
	t.Helper()
	c, err := net.Dial("tcp", strings.TrimPrefix(e.URL(), "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(testDeadline))
	body := fmt.Sprintf(`{"model":"m","prompt":"hello there","max_tokens":%d,"stream":true}`, maxTokens)
	if _, err := fmt.Fprintf(c, "POST /v1/completions HTTP/1.1\r\nHost: e\r\nContent-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s", len(body), body); err != nil {
		t.Fatal(err)
	}
	r := bufio.NewReader(c)
	for { // the status line and headers
		line, err := r.ReadString('\n')
		if err != nil {
			t.Fatal(err)
		}
		if line == "\r\n" {
			break
		}
	}
	var chunks []string
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			t.Fatal(err)
		}
		n, err := strconv.ParseInt(strings.TrimSpace(line), 16, 32)
		if err != nil {
			t.Fatalf("chunk size %q: %v", line, err)
		}
		if n == 0 {
			return chunks
		}
		b := make([]byte, n+2)
		if _, err := io.ReadFull(r, b); err != nil {
			t.Fatal(err)
		}
		chunks = append(chunks, string(b[:n]))
	}
}

// TestEventPerWrite: with Config.EventPerWrite every event of a zero-cost stream is its own
// HTTP chunk; without it the whole answer, produced at once, goes out in fewer.
func TestEventPerWrite(t *testing.T) {
	const tokens = 16
	for _, perWrite := range []bool{false, true} {
		t.Run(strconv.FormatBool(perWrite), func(t *testing.T) {
			e := startEngine(t, Config{Model: "m", ZeroCost: true, EventPerWrite: perWrite})
			chunks := chunksOf(t, e, tokens)
			events := 0
			for _, c := range chunks {
				events += strings.Count(c, "\n\n")
				if perWrite && (strings.Count(c, "\n\n") != 1 || !strings.HasSuffix(c, "\n\n")) {
					t.Errorf("chunk %q is not one whole event", c)
				}
			}
			// tokens, the final chunk with the finish reason, [DONE]
			if events != tokens+2 {
				t.Errorf("%d events, want %d", events, tokens+2)
			}
			if perWrite && len(chunks) != events {
				t.Errorf("%d chunks for %d events", len(chunks), events)
			}
			if !perWrite && len(chunks) >= events {
				t.Errorf("%d chunks for %d events: the events produced together should share writes", len(chunks), events)
			}
		})
	}
}
