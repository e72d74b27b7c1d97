package mockengine

import (
	"encoding/json"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"switchyard/load"
)

type result struct {
	r   response
	err error
}

// async sends a request on another goroutine; the test must receive its result.
func async(t *testing.T, method, url string, body any) <-chan result {
	t.Helper()
	hc := newClient(t)
	ch := make(chan result, 1)
	go func() {
		r, err := tryDo(hc, method, url, body)
		ch <- result{r, err}
	}()
	return ch
}

func await(t *testing.T, ch <-chan result) response {
	t.Helper()
	select {
	case res := <-ch:
		if res.err != nil {
			t.Fatal(res.err)
		}
		return res.r
	case <-time.After(testDeadline):
		t.Fatal("no response within the deadline")
	}
	return response{}
}

func pdBody(prompt []uint32, host string, port any, room uint64) map[string]any {
	return map[string]any{
		"input_ids": prompt, "sampling_params": map[string]any{"max_new_tokens": 4}, "return_logprob": true,
		"bootstrap_host": host, "bootstrap_port": port, "bootstrap_room": room,
	}
}

// TestPDDecodeWaitsForPrefill holds the prefill engine's clock so that its prefill cannot
// finish, and checks that the decode engine answers only once it has.
func TestPDDecodeWaitsForPrefill(t *testing.T) {
	pclk := NewManualClock(time.Unix(1_800_000_000, 0))
	p := startEngine(t, Config{Role: RolePrefill, Clock: pclk, LoadPublish: LoadPublish{Disabled: true}})
	d := startEngine(t, Config{Role: RoleDecode, ZeroCost: true})
	if p.BootstrapPort() == 0 {
		t.Fatal("prefill engine has no bootstrap port")
	}
	prompt := ids(7, 50)
	const room = 1<<63 - 1
	body := pdBody(prompt, "127.0.0.1", p.BootstrapPort(), room)

	// The decode engine gets the request first, as it may from a router.
	dDone := async(t, "POST", d.URL()+"/generate", body)
	waitLoad(t, d, "the decode request waiting for its KV", func(r load.RankReport) bool { return r.Waiting == 1 })
	pDone := async(t, "POST", p.URL()+"/generate", body)
	waitLoad(t, p, "the prefill request running", func(r load.RankReport) bool { return r.Running == 1 })
	if err := pclk.WaitForTimers(t.Context(), 1); err != nil { // the prefill step is under way
		t.Fatal(err)
	}
	select {
	case res := <-dDone:
		t.Fatalf("decode answered before its prefill finished: %+v", res)
	default:
	}
	pclk.Advance(time.Hour) // finish the prefill

	pr := await(t, pDone)
	if pr.status != 200 {
		t.Fatalf("prefill: %d %s", pr.status, pr.body)
	}
	if got := num(t, path(t, pr.json(t), "meta_info", "completion_tokens")); got != 1 {
		t.Errorf("prefill produced %d tokens, want 1", got)
	}
	dr := await(t, dDone)
	if dr.status != 200 {
		t.Fatalf("decode: %d %s", dr.status, dr.body)
	}
	dm := dr.json(t)
	if got := num(t, path(t, dm, "meta_info", "completion_tokens")); got != 4 {
		t.Errorf("decode produced %d tokens, want 4", got)
	}
	if n := len(path(t, dm, "meta_info", "input_token_logprobs").([]any)); n != 0 {
		t.Errorf("decode returned %d input logprobs; the prefill engine's are the ones to prepend", n)
	}
	if n := len(path(t, pr.json(t), "meta_info", "input_token_logprobs").([]any)); n != len(prompt) {
		t.Errorf("prefill returned %d input logprobs, want %d", n, len(prompt))
	}

	// A second round reuses the prefill engine's cache; the decode engine reports its hit.
	runClock(t, pclk)
	body = pdBody(prompt, "127.0.0.1", p.BootstrapPort(), 42)
	pDone, dDone = async(t, "POST", p.URL()+"/generate", body), async(t, "POST", d.URL()+"/generate", body)
	if r := await(t, pDone); r.status != 200 {
		t.Fatalf("prefill: %d %s", r.status, r.body)
	}
	dr = await(t, dDone)
	if got, want := num(t, path(t, dr.json(t), "meta_info", "cached_tokens")), 49/16*16; got != want {
		t.Errorf("decode reports cached_tokens %d, want the prefill engine's %d", got, want)
	}
}

func TestPDFailsVisibly(t *testing.T) {
	dclk := NewManualClock(time.Unix(1_800_000_000, 0))
	p := startEngine(t, Config{Role: RolePrefill, ZeroCost: true})
	d := startEngine(t, Config{Role: RoleDecode, ZeroCost: true, Clock: dclk, PDTimeout: 5 * time.Second, LoadPublish: LoadPublish{Disabled: true}})
	c := newClient(t)
	closedPort := func() int {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		port := ln.Addr().(*net.TCPAddr).Port
		ln.Close()
		return port
	}()

	t.Run("missing bootstrap fields", func(t *testing.T) {
		for _, e := range []*Engine{p, d} {
			r := do(t, c, "POST", e.URL()+"/generate", map[string]any{"text": "hi"})
			if r.status != 400 || !strings.Contains(string(r.body), "bootstrap") {
				t.Errorf("%s: %d %s, want 400 naming the bootstrap fields", e.Config().Role, r.status, r.body)
			}
		}
	})
	t.Run("wrong port", func(t *testing.T) {
		r := do(t, c, "POST", d.URL()+"/generate", pdBody(ids(1, 20), "127.0.0.1", closedPort, 5))
		if r.status != 500 || !strings.Contains(string(r.body), "bootstrap room 5 from 127.0.0.1:"+strconv.Itoa(closedPort)) {
			t.Errorf("%d %s, want 500 naming the room and peer", r.status, r.body)
		}
	})
	t.Run("wrong host", func(t *testing.T) {
		r := do(t, c, "POST", d.URL()+"/generate", pdBody(ids(1, 20), "127.0.0.9", p.BootstrapPort(), 6))
		if r.status != 500 || !strings.Contains(string(r.body), "127.0.0.9") {
			t.Errorf("%d %s, want 500 naming the host", r.status, r.body)
		}
	})
	t.Run("wrong room", func(t *testing.T) {
		// The prefill engine completes room 7; the decode engine waits for room 8.
		if r := do(t, c, "POST", p.URL()+"/generate", pdBody(ids(1, 20), "127.0.0.1", p.BootstrapPort(), 7)); r.status != 200 {
			t.Fatalf("prefill: %d %s", r.status, r.body)
		}
		done := async(t, "POST", d.URL()+"/generate", pdBody(ids(1, 20), "127.0.0.1", p.BootstrapPort(), 8))
		if err := dclk.WaitForTimers(t.Context(), 1); err != nil { // the transfer timeout is armed
			t.Fatal(err)
		}
		dclk.Advance(5 * time.Second)
		r := await(t, done)
		if r.status != 500 || !strings.Contains(string(r.body), "room 8") || !strings.Contains(string(r.body), "did not complete") {
			t.Errorf("%d %s, want 500 after the transfer timeout", r.status, r.body)
		}
	})
	t.Run("prompt mismatch", func(t *testing.T) {
		if r := do(t, c, "POST", p.URL()+"/generate", pdBody(ids(1, 20), "127.0.0.1", p.BootstrapPort(), 9)); r.status != 200 {
			t.Fatalf("prefill: %d %s", r.status, r.body)
		}
		r := do(t, c, "POST", d.URL()+"/generate", pdBody(ids(1, 21), "127.0.0.1", p.BootstrapPort(), 9))
		if r.status != 500 || !strings.Contains(string(r.body), "prompt tokens") {
			t.Errorf("%d %s, want 500 for a different prompt", r.status, r.body)
		}
	})
	t.Run("null port means the default", func(t *testing.T) {
		r := do(t, c, "POST", d.URL()+"/generate", pdBody(ids(1, 20), "127.0.0.9", nil, 10))
		if r.status != 500 || !strings.Contains(string(r.body), "127.0.0.9:8998") {
			t.Errorf("%d %s, want a failure naming port 8998", r.status, r.body)
		}
	})
}

// TestPDTransferBackends: /server_info reports the engines' PD compatibility facts as
// SGLang's server arguments name them, and a decode engine refuses the KV of a prefill
// engine with another transfer backend, while one of the same backend takes it.
func TestPDTransferBackends(t *testing.T) {
	p := startEngine(t, Config{Role: RolePrefill, ZeroCost: true, TransferBackend: "nixl", KVCacheDType: "fp8_e4m3", TPSize: 4, PageSize: 32})
	dSame := startEngine(t, Config{Role: RoleDecode, ZeroCost: true, TransferBackend: "nixl", PageSize: 32})
	dOther := startEngine(t, Config{Role: RoleDecode, ZeroCost: true, PageSize: 32}) // mooncake, the default
	c := newClient(t)

	info := do(t, c, "GET", p.URL()+"/server_info", nil)
	var fields map[string]any
	if err := json.Unmarshal(info.body, &fields); err != nil {
		t.Fatal(err)
	}
	if fields["disaggregation_transfer_backend"] != "nixl" || fields["kv_cache_dtype"] != "fp8_e4m3" ||
		fields["tp_size"] != 4.0 || fields["page_size"] != 32.0 {
		t.Fatalf("server_info %v", fields)
	}
	if r := do(t, c, "GET", dOther.URL()+"/server_info", nil); !strings.Contains(string(r.body), `"disaggregation_transfer_backend":"mooncake"`) {
		t.Fatalf("default backend: %s", r.body)
	}

	for room, d := range map[uint64]*Engine{11: dSame, 12: dOther} {
		body := pdBody(ids(1, 40), "127.0.0.1", p.BootstrapPort(), room)
		if r := do(t, c, "POST", p.URL()+"/generate", body); r.status != 200 {
			t.Fatalf("prefill: %d %s", r.status, r.body)
		}
		r := do(t, c, "POST", d.URL()+"/generate", body)
		if d == dSame && r.status != 200 {
			t.Errorf("same backend: %d %s", r.status, r.body)
		}
		if d == dOther && (r.status != 500 || !strings.Contains(string(r.body), `transfer backend \"nixl\" is not this engine's \"mooncake\"`)) {
			t.Errorf("other backend: %d %s, want a 500 naming both backends", r.status, r.body)
		}
	}
}
