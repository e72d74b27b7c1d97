package fleet

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"switchyard/config"
	"switchyard/internal/rawtest"
)

// scriptEngine answers each request on a connection of its own with answer, over TLS when
// tlsCfg is set: a test can cut the response's bytes anywhere.
func scriptEngine(t *testing.T, tlsCfg *tls.Config, answer func(c net.Conn)) string {
	t.Helper()
	return rawtest.Serve(t, func(c net.Conn) {
		if tlsCfg != nil {
			c = tls.Server(c, tlsCfg)
		}
		rawtest.OneRequest(answer)(c)
	})
}

// testPacer wakes every `every`; each wake is signalled on woke (without blocking) and read
// on unless stop is set.
type testPacer struct {
	every time.Duration
	woke  chan struct{}
	wakes int
	waits int
	stop  bool
}

func (p *testPacer) Due() time.Time { return time.Now().Add(p.every) }

func (p *testPacer) Waiting() bool {
	p.waits++
	return true
}

func (p *testPacer) Woke() bool {
	p.wakes++
	select {
	case p.woke <- struct{}{}:
	default:
	}
	return !p.stop
}

// openStream sends a streaming request and returns its response with the body unread.
func openStream(t *testing.T, u *Upstream) *fasthttp.Response {
	t.Helper()
	req := fasthttp.AcquireRequest()
	defer fasthttp.ReleaseRequest(req)
	req.Header.SetMethod(fasthttp.MethodPost)
	req.SetRequestURI("/v1/chat/completions")
	req.Header.SetHost(u.HostPort())
	req.SetBodyString(`{"model":"m","stream":true}`)
	resp := fasthttp.AcquireResponse()
	resp.StreamBody = true
	if err := u.Do(req, resp, time.Now().Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = resp.CloseBodyStream()
		fasthttp.ReleaseResponse(resp)
	})
	return resp
}

const streamHead = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"

// TestPacedReadResumesMidFrame: a paced read that waits past its Due with the chunked
// framing cut anywhere (inside the chunk size, before its CRLF, inside the data, before the
// data's CRLF) wakes, and the read goes on where it was: the body arrives whole, over plain
// TCP and over TLS (a TLS read that times out loses nothing either).
func TestPacedReadResumesMidFrame(t *testing.T) {
	const ev = "data: {\"x\":12}\n\n" // 0x10 bytes
	frame := "10\r\n" + ev + "\r\n"
	cuts := map[string]int{"in the size": 1, "before the size's CRLF": 2, "in the CRLF": 3, "in the data": 9, "before the data's CRLF": 4 + len(ev)}
	ca, serverCfg := testCertificates(t)
	roots := x509.NewCertPool()
	roots.AddCert(ca)
	for _, secure := range []bool{false, true} {
		for name, cut := range cuts {
			name := name
			if secure {
				name = "TLS " + name
			}
			t.Run(name, func(t *testing.T) {
				resume := make(chan struct{})
				var srvCfg, cliCfg *tls.Config
				if secure {
					srvCfg, cliCfg = serverCfg, &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}
				}
				addr := scriptEngine(t, srvCfg, func(c net.Conn) {
					_, _ = io.WriteString(c, streamHead+frame+frame[:cut])
					select {
					case <-resume:
					case <-time.After(20 * time.Second):
						return
					}
					_, _ = io.WriteString(c, frame[cut:]+"0\r\n\r\n")
				})
				u, _ := testUpstream(t, addr, config.Upstream{}, nil, cliCfg)
				resp := openStream(t, u)
				st := StreamOf(resp)
				if !st.Valid() {
					t.Fatal("no stream for an upstream's response")
				}
				p := &testPacer{every: 5 * time.Millisecond, woke: make(chan struct{}, 1)}
				if !st.Pace(p) {
					t.Fatal("Pace refused")
				}
				ended := make(chan struct{})
				defer close(ended)
				go func() {
					select {
					case <-p.woke: // the read waited with the frame cut
						close(resume)
					case <-ended:
					}
				}()
				body, err := io.ReadAll(resp.BodyStream())
				defer st.Unpace()
				if err != nil || string(body) != ev+ev {
					t.Fatalf("body %q, %v; want %q", body, err, ev+ev)
				}
				if p.wakes == 0 {
					t.Fatal("the read never woke")
				}
				if !st.Waits() || p.waits == 0 {
					t.Fatalf("Waiting ran %d times (Waits %v): it must run before every wait", p.waits, st.Waits())
				}
			})
		}
	}
}

// TestPacedReadEndsWhenWokeSaysSo: Woke returning false ends the read with a timeout error.
func TestPacedReadEndsWhenWokeSaysSo(t *testing.T) {
	addr := scriptEngine(t, nil, func(c net.Conn) {
		_, _ = io.WriteString(c, streamHead+"10\r\ndata: {\"x\":12}\n\n\r\n")
		_, _ = c.Read(make([]byte, 1)) // until the router closes
	})
	u, _ := testUpstream(t, addr, config.Upstream{}, nil, nil)
	resp := openStream(t, u)
	st := StreamOf(resp)
	p := &testPacer{every: 5 * time.Millisecond, woke: make(chan struct{}, 1), stop: true}
	st.Pace(p)
	defer st.Unpace()
	buf := make([]byte, 64)
	if n, err := resp.BodyStream().Read(buf); n == 0 || err != nil {
		t.Fatalf("first read: %d %v", n, err)
	}
	_, err := resp.BodyStream().Read(buf)
	if !IsTimeout(err) || p.wakes != 1 {
		t.Fatalf("read after a refused wake: %v after %d wakes, want a timeout after 1", err, p.wakes)
	}
}

// TestStreamInterrupt: Interrupt from another goroutine ends a paced read blocked on a
// silent engine at once; InterruptStreams reaches paced connections only (a buffered
// request waiting on the engine completes), and a connection paced after it is interrupted
// at once.
func TestStreamInterrupt(t *testing.T) {
	release := make(chan struct{})
	addr := scriptEngine(t, nil, func(c net.Conn) {
		// Streams send one event and go silent; the buffered request waits for release.
		_, _ = io.WriteString(c, streamHead+"10\r\ndata: {\"x\":12}\n\n\r\n")
		select {
		case <-release:
		case <-time.After(20 * time.Second):
		}
		_, _ = io.WriteString(c, "0\r\n\r\n")
	})
	u, tr := testUpstream(t, addr, config.Upstream{}, nil, nil)

	readAll := func(resp *fasthttp.Response) <-chan error {
		done := make(chan error, 1)
		go func() {
			_, err := io.ReadAll(resp.BodyStream())
			done <- err
		}()
		return done
	}
	wait := func(ch <-chan error, what string) error {
		select {
		case err := <-ch:
			return err
		case <-time.After(10 * time.Second):
			t.Fatalf("%s did not end", what)
			return nil
		}
	}

	// Interrupt.
	resp := openStream(t, u)
	st := StreamOf(resp)
	p := &testPacer{every: 5 * time.Millisecond, woke: make(chan struct{}, 1)}
	st.Pace(p)
	done := readAll(resp)
	<-p.woke // blocked on the silent engine, waking and reading on
	st.Interrupt()
	if err := wait(done, "the interrupted read"); err == nil || !st.Interrupted() {
		t.Fatalf("interrupted read: %v (interrupted %v)", err, st.Interrupted())
	}
	st.Unpace()

	// InterruptStreams.
	paced := openStream(t, u)
	ps := StreamOf(paced)
	pp := &testPacer{every: 5 * time.Millisecond, woke: make(chan struct{}, 1)}
	ps.Pace(pp)
	pacedDone := readAll(paced)
	<-pp.woke
	buffered := make(chan error, 1)
	go func() {
		st, body, err := post(u, false, time.Minute)
		if err == nil && (st != 200 || !strings.Contains(body, "data:")) {
			err = errors.New("buffered answer: " + body)
		}
		buffered <- err
	}()
	tr.conns.interruptStreams()
	if err := wait(pacedDone, "the paced read"); err == nil || !ps.Interrupted() {
		t.Fatalf("paced read after InterruptStreams: %v", err)
	}
	ps.Unpace()
	late := openStream(t, u)
	ls := StreamOf(late)
	if ls.Pace(&testPacer{every: time.Second}) {
		t.Fatal("Pace after InterruptStreams went ahead")
	}
	ls.Unpace()
	if _, err := io.ReadAll(late.BodyStream()); err == nil {
		t.Fatal("a stream paced after InterruptStreams was read")
	}
	close(release)
	if err := wait(buffered, "the buffered request"); err != nil {
		t.Fatalf("a buffered request was cut by InterruptStreams: %v", err)
	}
}
