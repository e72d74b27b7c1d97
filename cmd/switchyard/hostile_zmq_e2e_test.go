package main

import (
	"net"
	"net/http"
	"sync"
	"testing"
	"time"

	"switchyard/load/zmtp/zmtptest"
)

// hostilePub is a server that greets as a ZMQ PUB and then claims a 2^40-byte frame, to
// every peer; hungUp counts the connections the router hung up on so far.
func hostilePub(t *testing.T) (endpoint string, hungUp func() int) {
	t.Helper()
	ep, ends := zmtptest.Server(t, "PUB", zmtptest.Claim(1<<40))
	var mu sync.Mutex
	n := 0
	done := make(chan struct{})
	var wg sync.WaitGroup
	t.Cleanup(func() { close(done); wg.Wait() })
	wg.Go(func() {
		for {
			select {
			case err := <-ends:
				if err == nil {
					mu.Lock()
					n++
					mu.Unlock()
				}
			case <-done:
				return
			}
		}
	})
	return ep, func() int { mu.Lock(); defer mu.Unlock(); return n }
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

	// The bound SUB: hostile peers dial it.
	zmtptest.Attack(t, bind, "PUB", zmtptest.Claim(1<<40))
	zmtptest.Attack(t, bind, "PUB", zmtptest.Frames(65))
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
