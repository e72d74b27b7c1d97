package main

import (
	"encoding/binary"
	"io"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"
)

// zmtpHello is a ZMTP 3.0 greeting (NULL mechanism) and READY command as sockType.
func zmtpHello(sockType string) []byte {
	g := make([]byte, 64)
	g[0], g[9], g[10] = 0xff, 0x7f, 3
	copy(g[12:], "NULL")
	ready := append([]byte{5}, "READY"...)
	ready = append(ready, 11)
	ready = append(ready, "Socket-Type"...)
	ready = binary.BigEndian.AppendUint32(ready, uint32(len(sockType)))
	ready = append(ready, sockType...)
	return append(append(g, 0x04, byte(len(ready))), ready...)
}

// claim2to40 is a frame header announcing 2^40 bytes, and a few of them.
var claim2to40 = append(binary.BigEndian.AppendUint64([]byte{0x02}, 1<<40), make([]byte, 64)...)

// hostilePub is a TCP server that greets as a ZMQ PUB and then claims a 2^40-byte frame, to
// every peer; it counts the connections the router hung up on.
func hostilePub(t *testing.T) (endpoint string, hungUp func() int) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	n := 0
	var wg sync.WaitGroup
	t.Cleanup(func() { _ = ln.Close(); wg.Wait() })
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Go(func() {
				defer c.Close()
				_ = c.SetDeadline(time.Now().Add(cacheWait))
				if _, err := c.Write(append(zmtpHello("PUB"), claim2to40...)); err != nil {
					return
				}
				if _, err := io.Copy(io.Discard, c); err == nil {
					mu.Lock()
					n++
					mu.Unlock()
				}
			})
		}
	})
	return "tcp://" + ln.Addr().String(), func() int { mu.Lock(); defer mu.Unlock(); return n }
}

// TestHostileZMQPeersCannotCrashTheRouter (issue 13, item 1): peers that claim a 2^40-byte
// frame on the router's bound SUB (kv.bind_endpoint) and behind the kv_events and
// load_publish URLs of a worker added through POST /workers are hung up on and counted;
// the router lives on and serves.
func TestHostileZMQPeersCannotCrashTheRouter(t *testing.T) {
	engines := startCacheEngines(t, 2)
	ln, err := net.Listen("tcp", "127.0.0.1:0") // a port for kv.bind_endpoint, which takes no 0
	if err != nil {
		t.Fatal(err)
	}
	bind := ln.Addr().String()
	_ = ln.Close()
	cfg := cacheRouterConfig(engines)
	cfg.KV.BindEndpoint = "tcp://" + bind
	r := startCacheRouter(t, cfg)
	select {
	case <-r.srv.Cache().Manager().BoundReady():
	case <-time.After(cacheWait):
		t.Fatal("the bound SUB never listened")
	}

	// The bound SUB: a hostile peer dials it.
	for range 2 {
		c, err := net.DialTimeout("tcp", bind, cacheWait)
		if err != nil {
			t.Fatal(err)
		}
		_ = c.SetDeadline(time.Now().Add(cacheWait))
		if _, err := c.Write(append(zmtpHello("PUB"), claim2to40...)); err != nil {
			t.Fatal(err)
		}
		if _, err := io.Copy(io.Discard, c); err != nil {
			t.Fatalf("the bound SUB did not hang up: %v", err)
		}
		_ = c.Close()
	}
	// Endpoints the router subscribes to, named by an admin API caller.
	kvEP, kvHung := hostilePub(t)
	loadEP, loadHung := hostilePub(t)
	body := `{"id":"H","url":"` + engines[0].URL() + `","model":"` + cacheModel + `","kv_events":"` + kvEP + `","load_publish":"` + loadEP + `"}`
	if _, out, err := httpPost(r.base+"/workers", body); err != nil {
		t.Fatalf("POST /workers: %v %s", err, out)
	}
	waitFor(t, "both hostile publishers hung up on, twice (the subscriptions redial)", func() (bool, string) {
		return kvHung() >= 2 && loadHung() >= 2, "not yet"
	})
	if n := metricValue(t, r.base+"/metrics", `switchyard_zmq_peer_drops_total{component="kv_events",reason="too_large"}`); n < 4 {
		t.Fatalf("kv_events too_large drops %v, want at least 4 (2 bound, 2 subscribed)", n)
	}
	if n := metricValue(t, r.base+"/metrics", `switchyard_zmq_peer_drops_total{component="load_gauge",reason="too_large"}`); n < 2 {
		t.Fatalf("load_gauge too_large drops %v, want at least 2", n)
	}
	// Alive and serving.
	if status, _, err := httpGet(r.base + "/health"); err != nil || status != http.StatusOK {
		t.Fatalf("/health: %d %v", status, err)
	}
	if _, err := postChat(t.Context(), r.base, cacheMessages(cachePrefix("after the attack"), "q"), 1); err != nil {
		t.Fatalf("a request after the attacks: %v", err)
	}
}
