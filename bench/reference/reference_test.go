package reference

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/signal"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"switchyard/bench/mockengine"
)

// bareChildEnv, set in a child's environment, makes this test binary the bare proxy
// command (BareCommand; "evloop": EvloopCommand): StartBareProcess and StartEvloopProcess
// are tested with the test binary as their program.
const bareChildEnv = "REFERENCE_TEST_BARE_PROXY"

func TestMain(m *testing.M) {
	if child := os.Getenv(bareChildEnv); child != "" {
		ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
		command := BareCommand
		if child == "evloop" {
			command = EvloopCommand
		}
		err := command(ctx, os.Args[1:], os.Stdout, os.Stderr)
		stop()
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// bareProcess starts the bare proxy as its own process (this test binary as BareCommand).
func bareProcess(t *testing.T, engines []string) *Proxy {
	t.Helper()
	t.Setenv(bareChildEnv, "1")
	p, err := StartBareProcess([]string{os.Args[0]}, engines, ProcessOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// evloopProcess starts the event-loop proxy as its own process (this test binary as
// EvloopCommand).
func evloopProcess(t *testing.T, engines []string) *Proxy {
	t.Helper()
	t.Setenv(bareChildEnv, "evloop")
	p, err := StartEvloopProcess([]string{os.Args[0]}, engines, ProcessOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// startEngines starts n zero-cost mock engines that flush every streamed event, closed at
// the end of the test.
func startEngines(t *testing.T, n int) []string {
	t.Helper()
	urls := make([]string, n)
	for i := range urls {
		e, err := mockengine.Start(context.Background(), mockengine.Config{Model: "m", ZeroCost: true, EventPerWrite: true,
			KVEvents: mockengine.KVEvents{Disabled: true}, LoadPublish: mockengine.LoadPublish{Disabled: true}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = e.Close() })
		urls[i] = e.URL()
	}
	return urls
}

// nginx starts nginx in front of engines, or skips the test when there is no nginx (fails
// it under CI=true).
func nginx(t *testing.T, engines []string) *Proxy {
	t.Helper()
	needNginx(t)
	p, err := StartNginx(engines, NginxOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// needNginx skips the test when there is no nginx (fails it under CI=true). A test calls it
// before it starts anything: a fasthttp server shut down before its Serve has begun keeps
// serving (its listener is not yet registered), and the test's cleanup waited for it for
// ever.
func needNginx(t *testing.T) {
	t.Helper()
	if _, err := NginxBinary(); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("nginx not found: CI measures the router against it (make testdeps; Debian: apt-get install nginx)")
		}
		t.Skip("SKIPPED: nginx not found, the nginx reference is not tested (make testdeps; Debian: apt-get install nginx)")
	}
}

// post sends body to url's /v1/chat/completions and returns the status and answer.
func post(t *testing.T, url, body string) (int, string) {
	t.Helper()
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.SetRequestURI(url + "/v1/chat/completions")
	req.Header.SetMethod(fasthttp.MethodPost)
	req.Header.SetContentType("application/json")
	req.SetBodyString(body)
	if err := fasthttp.DoTimeout(req, resp, 10*time.Second); err != nil {
		t.Fatalf("%s: %v", url, err)
	}
	return resp.StatusCode(), string(resp.Body())
}

const (
	small  = `{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":1}`
	stream = `{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":64,"stream":true}`
)

// TestProxies: the bare proxy, the event-loop proxy and nginx relay a small answer and a 64-event stream
// unchanged in shape, over several keep-alive requests, and stop cleanly.
func TestProxies(t *testing.T) {
	engines := startEngines(t, 2)
	for _, name := range []string{"bare", "bare process", "evloop", "evloop process", "nginx"} {
		t.Run(name, func(t *testing.T) {
			var p *Proxy
			switch name {
			case "nginx":
				p = nginx(t, engines)
			case "bare process":
				p = bareProcess(t, engines)
			case "evloop process":
				p = evloopProcess(t, engines)
			case "evloop":
				var err error
				if p, err = StartEvloop(engines); err != nil {
					t.Fatal(err)
				}
			default:
				var err error
				if p, err = StartBare(engines); err != nil {
					t.Fatal(err)
				}
			}
			if want, _, _ := strings.Cut(name, " "); p.Name() != want {
				t.Errorf("Name %q", p.Name())
			}
			for range 4 {
				code, body := post(t, p.URL(), small)
				if code != 200 || !strings.Contains(body, `"chat.completion"`) {
					t.Fatalf("small: %d %q", code, body)
				}
				code, body = post(t, p.URL(), stream)
				// 64 tokens, the finish reason's event, [DONE]
				if code != 200 || strings.Count(body, "\n\n") != 66 || !strings.HasSuffix(body, "data: [DONE]\n\n") {
					t.Fatalf("stream: %d, %d events: %q", code, strings.Count(body, "\n\n"), body)
				}
			}
			cpu, ok := p.ExternalCPU()
			if !ok || cpu < 0 || ((name == "bare" || name == "evloop") && cpu != 0) {
				t.Errorf("ExternalCPU %v %v", cpu, ok)
			}
			addr := strings.TrimPrefix(p.URL(), "http://")
			if err := p.Close(); err != nil {
				t.Fatal(err)
			}
			if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
				c.Close()
				t.Errorf("%s still accepts connections after Close", name)
			}
		})
	}
}

// TestBareProcessCounted: the bare proxy process's CPU is its own, counted by ExternalCPU
// while it serves (not this process's), and a command that does not serve fails the start
// with what it said.
func TestBareProcessCounted(t *testing.T) {
	engines := startEngines(t, 1)
	p := bareProcess(t, engines)
	t.Cleanup(func() { _ = p.Close() })
	before, _ := p.ExternalCPU()
	// /proc counts CPU in 10 ms ticks: enough requests for a few of them.
	deadline := time.Now().Add(20 * time.Second)
	for n := 0; ; n++ {
		if code, body := post(t, p.URL(), small); code != 200 {
			t.Fatalf("%d %q", code, body)
		}
		if cpu, ok := p.ExternalCPU(); !ok {
			t.Fatal("ExternalCPU unknown")
		} else if cpu-before >= 30*time.Millisecond {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the bare proxy process used no CPU over %d requests", n)
		}
	}
	t.Setenv(bareChildEnv, "1")
	_, err := StartBareProcess([]string{os.Args[0], "--no-such-flag"}, engines, ProcessOptions{})
	if err == nil || !strings.Contains(err.Error(), "no-such-flag") {
		t.Fatalf("a failing command: err = %v", err)
	}
}

// TestNginxBadBinary: a binary that is not nginx fails StartNginx with what it said, and
// leaves nothing running.
func TestNginxBadBinary(t *testing.T) {
	_, err := StartNginx([]string{"http://127.0.0.1:1"}, NginxOptions{Binary: "/bin/false"})
	if err == nil || !strings.Contains(err.Error(), "cannot start nginx") {
		t.Fatalf("err = %v", err)
	}
}

// TestNginxKeepsAConnectionPerEngine: one request at a time over more engines than the
// keep-alive setting asks for, nginx still reuses one connection per engine instead of
// opening a new one whenever round robin comes back to an engine.
func TestNginxKeepsAConnectionPerEngine(t *testing.T) {
	needNginx(t)
	const engines = 3
	var conns atomic.Int64
	urls := make([]string, engines)
	for i := range urls {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		srv := &fasthttp.Server{
			Handler: func(ctx *fasthttp.RequestCtx) {
				ctx.SetContentType("application/json")
				ctx.SetBodyString(`{"object":"chat.completion"}`)
			},
			ConnState: func(_ net.Conn, s fasthttp.ConnState) {
				if s == fasthttp.StateNew {
					conns.Add(1)
				}
			},
		}
		done := make(chan error, 1)
		go func() { done <- srv.Serve(ln) }()
		t.Cleanup(func() {
			if err := srv.Shutdown(); err != nil {
				t.Error(err)
			}
			if err := <-done; err != nil {
				t.Error(err)
			}
		})
		urls[i] = "http://" + ln.Addr().String()
	}
	p, err := StartNginx(urls, NginxOptions{Keepalive: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := p.Close(); err != nil {
			t.Error(err)
		}
	})
	const requests = 30
	for range requests {
		if code, body := post(t, p.URL(), small); code != 200 {
			t.Fatalf("%d %q", code, body)
		}
	}
	if n := conns.Load(); n > engines+1 {
		t.Errorf("nginx opened %d connections to %d engines for %d requests one at a time, want at most %d", n, engines, requests+1, engines+1)
	}
}
