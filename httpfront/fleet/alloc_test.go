//go:build !race

package fleet

import (
	"io"
	"net"
	"testing"
	"time"

	"switchyard/config"
	"switchyard/engine"
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
