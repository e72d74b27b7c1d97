package mockengine

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestStreamSendsEveryToken streams many short chat completions at once from an engine
// whose steps cost a microsecond on a discrete-event clock, so that sequences run to their
// end while their streams look at them, and checks that every stream carries every token
// its usage counts, then its [DONE].
//
// A stream that looked at a sequence's token count before its finished flag lost the
// tokens produced between the two loads (all of them, for a short answer: a 200 stream
// with a finish reason and usage but no content). No test can force a write between two
// adjacent loads; with a pause put between them by hand, this test failed on most streams,
// and it passes with the pause in the fixed order.
func TestStreamSendsEveryToken(t *testing.T) {
	clk := NewManualClock(time.Unix(1_800_000_000, 0))
	runClock(t, clk)
	e := startEngine(t, Config{Clock: clk, Model: "m", Costs: &Costs{DecodeStep: time.Microsecond},
		KVEvents: KVEvents{Disabled: true}, LoadPublish: LoadPublish{Disabled: true}})
	c := newClient(t)
	const clients, perClient = 8, 100
	var wg sync.WaitGroup
	errs := make(chan string, clients*perClient)
	for k := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range perClient {
				maxTokens := 1 + (k+i)%3
				body := chatReq(true, maxTokens)
				body["stream_options"] = map[string]any{"include_usage": true}
				if msg := streamFault(t.Context(), c, e.URL(), body, maxTokens); msg != "" {
					errs <- msg
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	n := 0
	for msg := range errs {
		if n++; n <= 3 {
			t.Error(msg)
		}
	}
	if n > 0 {
		t.Errorf("%d of %d streams are wrong", n, clients*perClient)
	}
}

// streamFault sends one streaming chat completion of want tokens and describes what is
// wrong with its stream, or returns "".
func streamFault(ctx context.Context, c *http.Client, url string, body map[string]any, want int) string {
	req, err := newRequest(ctx, url+"/v1/chat/completions", body)
	if err != nil {
		return err.Error()
	}
	resp, err := c.Do(req)
	if err != nil {
		return err.Error()
	}
	defer resp.Body.Close()
	events, done, err := sseEvents(resp.Body)
	if err != nil || !done || resp.StatusCode != http.StatusOK {
		return "status " + resp.Status + ": stream without its [DONE]"
	}
	tokens, usage := 0, -1
	for _, ev := range events {
		var chunk struct {
			Choices []struct {
				Delta struct {
					Content *string `json:"content"`
				} `json:"delta"`
			} `json:"choices"`
			Usage *struct {
				CompletionTokens int `json:"completion_tokens"`
			} `json:"usage"`
		}
		if err := json.Unmarshal([]byte(ev), &chunk); err != nil {
			return "malformed event " + ev
		}
		for _, ch := range chunk.Choices {
			if ch.Delta.Content != nil {
				tokens++
			}
		}
		if chunk.Usage != nil {
			usage = chunk.Usage.CompletionTokens
		}
	}
	if tokens != want || usage != want {
		return "want " + itoa(want) + " tokens, got " + itoa(tokens) + " content chunks and usage " + itoa(usage) + ": " + strings.Join(events, " | ")
	}
	return ""
}
