package main

import (
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"switchyard/bench/mockengine"
	"switchyard/config"
)

// mixedFleet starts two prefill and two decode mock engines of each of two KV transfer
// backends, and a router whose workers name nothing but URL, model and role: the backends
// come from introspection. rule is the PD group's compatibility.
func mixedFleet(t *testing.T, rule []string) (url string, backend map[string]string) {
	t.Helper()
	backend = map[string]string{}
	cfg := config.Default()
	cfg.Server.Port = 0
	var pre, dec []string
	for _, b := range []string{"nixl", "mooncake"} {
		for i, role := range []mockengine.Role{mockengine.RolePrefill, mockengine.RolePrefill, mockengine.RoleDecode, mockengine.RoleDecode} {
			id := string(role[0]) + "-" + b + "-" + string(rune('0'+i))
			e := startMock(t, mockengine.Config{WorkerID: id, Model: "llama", Role: role, ZeroCost: true, TransferBackend: b})
			backend[id] = b
			w := config.Worker{ID: id, URL: e.URL(), Model: "llama", Role: config.Role(role), DPSize: 1}
			if role == mockengine.RolePrefill {
				port := e.BootstrapPort()
				w.BootstrapPort = &port
				pre = append(pre, id)
			} else {
				dec = append(dec, id)
			}
			cfg.Workers = append(cfg.Workers, w)
		}
	}
	cfg.Models = map[string]config.Model{"llama": {Buckets: []config.Bucket{{ID: "pd", Groups: config.Groups{PD: &config.PDGroups{
		Prefill:       &config.Group{WorkerIDs: &pre, Policy: &config.Policy{Type: config.PolicyRoundRobin}},
		Decode:        &config.Group{WorkerIDs: &dec, Policy: &config.Policy{Type: config.PolicyRandom}},
		Compatibility: rule,
	}}}}}}
	_, url = startRouter(t, cfg)
	return url, backend
}

// pairTally counts a run's answers by the pair that served them.
type pairTally struct {
	compatible, incompatible             int // answers from a pair of one backend, of two
	compatibleFailed, incompatibleFailed int // of those, the ones that were not 200
	unpaired                             int // answers without a pair: the router dispatched nothing
}

// pairCounts sends n chat requests (streamed and not, from 8 clients) and tallies them.
func pairCounts(t *testing.T, url string, backend map[string]string, n int) pairTally {
	t.Helper()
	var mu sync.Mutex
	var wg sync.WaitGroup
	var c pairTally
	next := make(chan int)
	for range 8 {
		wg.Go(func() {
			for i := range next {
				status, h, _ := chatRequest(t, url, "llama", i%2 == 0)
				p, d := h.Get("X-Switchyard-Prefill-Worker"), h.Get("X-Switchyard-Worker")
				mu.Lock()
				switch {
				case p == "" && d == "":
					c.unpaired++
				case backend[p] == "" || backend[d] == "":
					t.Errorf("request %d: status %d, unknown pair %q+%q", i, status, p, d)
				case backend[p] == backend[d]:
					c.compatible++
					if status != 200 {
						c.compatibleFailed++
					}
				default:
					c.incompatible++
					if status != 200 {
						c.incompatibleFailed++
					}
				}
				mu.Unlock()
			}
		})
	}
	for i := range n {
		next <- i
	}
	close(next)
	wg.Wait()
	return c
}

// TestPDMixedTransferBackends is issue 16's PD target: in a fleet of two transfer backends,
// with groups.pd.compatibility [transfer_backend] and the backends learned from the engines'
// /server_info, 1,000 requests form no incompatible pair and all succeed. The same fleet
// without the rule pairs across backends, and the mock decode engines refuse those pairs,
// so the test can fail. (Without the rule the decode engines' breakers may open on those
// refusals, so some requests find no pair at all.)
func TestPDMixedTransferBackends(t *testing.T) {
	url, backend := mixedFleet(t, []string{config.LabelTransferBackend})
	if c := pairCounts(t, url, backend, 1000); c != (pairTally{compatible: 1000}) {
		t.Fatalf("with the rule: %+v; want 1000 compatible pairs, every one answered", c)
	}
	resp, err := http.Get(url + "/workers")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(b), `"labels":{"kv_cache_dtype":"auto","page_size":"16","tp_size":"1","transfer_backend":"nixl"}`) {
		t.Fatalf("GET /workers shows no introspected labels: %s", b)
	}

	url, backend = mixedFleet(t, nil)
	if c := pairCounts(t, url, backend, 200); c.incompatible == 0 || c.incompatibleFailed != c.incompatible || c.compatibleFailed != 0 {
		t.Fatalf("without the rule: %+v; want incompatible pairs, every one of them failed, and no compatible pair failed", c)
	}
}

// TestCheckRejectsPDGroupsThatCannotPair: switchyard check refuses a PD bucket whose
// configured prefill and decode members can never share the compatibility labels.
func TestCheckRejectsPDGroupsThatCannotPair(t *testing.T) {
	path := filepath.Join(t.TempDir(), "pd.yaml")
	if err := os.WriteFile(path, []byte(`
workers:
  - {id: P1, url: "http://127.0.0.1:1", model: m, role: prefill, labels: {transfer_backend: nixl}}
  - {id: D1, url: "http://127.0.0.1:2", model: m, role: decode, labels: {transfer_backend: mooncake}}
models:
  m:
    buckets:
      - id: pd
        groups:
          pd:
            prefill: {}
            decode: {}
            compatibility: [transfer_backend]
`), 0o600); err != nil {
		t.Fatal(err)
	}
	code, _, errOut := runCmd(t, "check", "--config", path)
	if code != 1 || !strings.Contains(errOut, "models.m.buckets[0].groups.pd.compatibility: no prefill member can ever pair with a decode member") {
		t.Fatalf("exit %d\n%s", code, errOut)
	}
}
