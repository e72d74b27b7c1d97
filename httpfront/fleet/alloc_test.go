//go:build !race

package fleet

import (
	"bytes"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"switchyard/config"
	"switchyard/engine"
	"switchyard/httpfront/internal/loopbench"
)

// TestDispatchAccountingAllocations locks in an allocation-free Admit and Done on the
// request path of a closed breaker, whatever the outcome counted.
func TestDispatchAccountingAllocations(t *testing.T) {
	s := testSettings()
	s.MinRequests = 1 << 30 // stays closed: the test measures the counting, not a transition
	w := engine.NewWorker("A", "http://a", "m", engine.StagePlain, nil)
	m := &Member{f: &Fleet{clock: SystemClock{}}, breaker: NewBreaker(s, time.Now, w.Counters.Dispatched)}
	w.Handle = m
	for _, o := range []Outcome{OutcomeSuccess, OutcomeNeutral, OutcomeError} {
		allocs := testing.AllocsPerRun(1000, func() {
			tk, ok := MemberOf(w).Admit(t0)
			if !ok {
				t.Fatal("refused")
			}
			tk.Done(o)
		})
		if allocs != 0 {
			t.Errorf("%v: %.1f allocations per dispatch, want 0", o, allocs)
		}
	}
}

// TestPacedReadAllocations locks in allocation-free reads of a paced stream (Stream.Pace):
// each read finds the socket empty (Waiting runs), waits for the engine's next chunk and
// reads it. The raw connection's read function is made once a connection, not once a read
// (a closure over the read's results cost three allocations per engine read).
func TestPacedReadAllocations(t *testing.T) {
	const ev = "data: {\"x\":12}\n\n" // 0x10 bytes
	frame := []byte("10\r\n" + ev + "\r\n")
	next := make(chan struct{})
	addr := scriptEngine(t, nil, func(c net.Conn) {
		_, _ = io.WriteString(c, streamHead)
		for range next {
			if _, err := c.Write(frame); err != nil {
				return
			}
		}
		_, _ = io.WriteString(c, "0\r\n\r\n")
	})
	u, _ := testUpstream(t, addr, config.Upstream{}, nil, nil)
	resp := openStream(t, u)
	st := StreamOf(resp)
	p := &testPacer{every: time.Minute, woke: make(chan struct{}, 1)}
	if !st.Pace(p) {
		t.Fatal("Pace refused")
	}
	defer st.Unpace()
	body := resp.BodyStream()
	buf := make([]byte, 256)
	readEvent := func() {
		next <- struct{}{}
		got := 0
		for got < len(ev) {
			n, err := body.Read(buf[got:])
			if err != nil {
				t.Fatal(err)
			}
			got += n
		}
	}
	readEvent() // the connection's first paced read
	allocs := testing.AllocsPerRun(200, readEvent)
	close(next)
	if allocs != 0 {
		t.Errorf("%.1f allocations per paced read, want 0", allocs)
	}
	if p.waits == 0 {
		t.Fatal("Waiting never ran: the reads did not wait for the socket")
	}
}

// TestStreamExchangeAllocations locks in what a streamed exchange allocates on a keep-alive
// engine connection: the request written, the headers read, the body read to its end and
// the connection given back to the pool. The body stream is the one allocation (the
// function that gave the connection back was a closure over it: one more).
func TestStreamExchangeAllocations(t *testing.T) {
	const ev = "data: {\"x\":12}\n\n" // 0x10 bytes
	addr, accepted := keepAliveEngine(t, []byte(streamHead+"10\r\n"+ev+"\r\n0\r\n\r\n"))
	u, _ := testUpstream(t, addr, config.Upstream{}, nil, nil)
	req := fasthttp.AcquireRequest()
	resp := fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	buf := make([]byte, 256)
	exchange := func() {
		req.Reset()
		req.Header.SetMethod(fasthttp.MethodPost)
		req.SetRequestURI("/v1/chat/completions")
		req.Header.SetHost(u.HostPort())
		req.SetBodyRaw(streamRequestBody)
		resp.StreamBody = true
		if err := u.Do(req, resp, time.Now().Add(time.Minute)); err != nil {
			t.Fatal(err)
		}
		got := 0
		for {
			n, err := resp.BodyStream().Read(buf[got:])
			got += n
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
		}
		if string(buf[:got]) != ev {
			t.Fatalf("body %q, want %q", buf[:got], ev)
		}
		if err := resp.CloseBodyStream(); err != nil {
			t.Fatal(err)
		}
	}
	for range 20 { // the connection and the pools
		exchange()
	}
	if allocs := testing.AllocsPerRun(200, exchange); allocs > 1 {
		t.Errorf("%.1f allocations per streamed exchange, want at most 1 (the body stream)", allocs)
	}
	if n := accepted.Load(); n != 1 {
		t.Errorf("%d engine connections, want 1 (each exchange gives it back)", n)
	}
}

var streamRequestBody = []byte(`{"model":"m","stream":true}`)

// keepAliveEngine serves, on one keep-alive connection at a time, every request (headers
// and a body of len(streamRequestBody) bytes) with answer, allocating nothing per request;
// it returns its address and the connections it accepted, and stops when the test ends.
func keepAliveEngine(t *testing.T, answer []byte) (string, *atomic.Int32) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var (
		accepted atomic.Int32
		wg       sync.WaitGroup
		mu       sync.Mutex
		conns    []net.Conn
	)
	accepting := make(chan struct{})
	go func() {
		defer close(accepting)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			accepted.Add(1)
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			wg.Add(1)
			go func() {
				defer wg.Done()
				serveCanned(c, answer)
			}()
		}
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		<-accepting
		mu.Lock()
		for _, c := range conns {
			_ = c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return ln.Addr().String(), &accepted
}

// serveCanned answers each request read from c (its headers' end, then the body) with
// answer, until c fails.
func serveCanned(c net.Conn, answer []byte) {
	buf := make([]byte, 4096)
	have := 0
	for {
		end := bytes.Index(buf[:have], []byte("\r\n\r\n"))
		if end >= 0 && have >= end+4+len(streamRequestBody) {
			used := end + 4 + len(streamRequestBody)
			have = copy(buf, buf[used:have])
			if _, err := c.Write(answer); err != nil {
				return
			}
			continue
		}
		if have == len(buf) {
			return
		}
		n, err := c.Read(buf[have:])
		if err != nil {
			return
		}
		have += n
	}
}

// TestSocketAllocations locks in allocation-free reads and writes of a Socket: a request
// written and its answer read, the peer echoing.
func TestSocketAllocations(t *testing.T) {
	end, peer := loopbench.Pair(t)
	s := NewSocket(end)
	msg := bytes.Repeat([]byte("x"), 200)
	in := make([]byte, len(msg))
	echo := make([]byte, len(msg))
	roundTrip := func() {
		if _, err := s.Write(msg); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(peer, echo); err != nil {
			t.Fatal(err)
		}
		if _, err := peer.Write(echo); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(s, in); err != nil {
			t.Fatal(err)
		}
	}
	roundTrip()
	if allocs := testing.AllocsPerRun(500, roundTrip); allocs != 0 {
		t.Errorf("%.1f allocations per write and read, want 0", allocs)
	}
	if !bytes.Equal(in, msg) {
		t.Error("the answer read is not what was written")
	}
}
