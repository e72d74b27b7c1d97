package actors

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/asynkron/protoactor-go/cluster"
)

// providerNode is what a member's membership endpoint (GET /_health) answers: the JSON
// Proto.Actor's automanaged provider serves, so that members of either kind find each other
// during an upgrade.
type providerNode struct {
	ID             string   `json:"id"`
	Address        string   `json:"address"`
	AutoManagePort int      `json:"auto_manage_port"`
	Port           int      `json:"port"`
	Kinds          []string `json:"kinds"`
	ClusterName    string   `json:"cluster_name"`
}

// providerPollTimeout bounds one poll of a member's endpoint; maxProviderNode bounds the
// answer read.
const (
	providerPollTimeout = 2 * time.Second
	maxProviderNode     = 64 << 10
)

// memberProvider is the automanaged membership (cluster.provider automanaged): every member
// serves its node on cluster.provider_port and polls every address of cluster.members each
// cluster.refresh_interval; the members that answer with this cluster's name are the
// topology. It replaces Proto.Actor's own automanaged provider, whose poll loop may still
// publish a departed member's EndpointTerminatedEvent after Shutdown returned: should that
// reach the remote's endpoint manager while it stops, the manager panics (nil connection
// table). Shutdown here cancels the polls and waits for the loop, so nothing is published
// once it returns. The loop and the HTTP server are the provider's goroutines.
type memberProvider struct {
	name    string
	hosts   []string
	port    int
	refresh time.Duration
	ln      net.Listener // served from StartMember on
	log     *slog.Logger

	client *http.Client
	srv    *http.Server
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	once   sync.Once
}

var _ cluster.ClusterProvider = (*memberProvider)(nil)

func newMemberProvider(name string, hosts []string, port int, refresh time.Duration, ln net.Listener, log *slog.Logger) *memberProvider {
	ctx, cancel := context.WithCancel(context.Background())
	return &memberProvider{name: name, hosts: hosts, port: port, refresh: refresh, ln: ln, log: log,
		client: &http.Client{Timeout: providerPollTimeout}, ctx: ctx, cancel: cancel}
}

// StartMember serves this member's node and starts polling the members.
func (p *memberProvider) StartMember(c *cluster.Cluster) error {
	host, port, err := c.ActorSystem.GetHostPort()
	if err != nil {
		return fmt.Errorf("cannot start the membership provider: %w", err)
	}
	body, err := json.Marshal(providerNode{ID: c.ActorSystem.ID, Address: host, Port: port, AutoManagePort: p.port,
		Kinds: c.GetClusterKinds(), ClusterName: p.name})
	if err != nil {
		return fmt.Errorf("cannot start the membership provider: %w", err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /_health", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(body)
	})
	p.srv = &http.Server{Handler: mux, ReadHeaderTimeout: providerPollTimeout}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		_ = p.srv.Serve(p.ln) // ends with Shutdown's Close
	}()
	return p.StartClient(c)
}

// StartClient starts polling the members.
func (p *memberProvider) StartClient(c *cluster.Cluster) error {
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		p.monitor(c.MemberList.UpdateClusterTopology)
	}()
	return nil
}

// Shutdown stops serving and polling and returns once the poll loop has ended.
func (p *memberProvider) Shutdown(bool) error {
	p.once.Do(func() {
		p.cancel()
		if p.srv != nil {
			_ = p.srv.Close()
		} else {
			_ = p.ln.Close()
		}
		p.wg.Wait()
	})
	return nil
}

// monitor polls the members every refresh and hands the topology to update (the member
// list's), never once Shutdown has begun.
func (p *memberProvider) monitor(update func(cluster.Members)) {
	defer func() {
		if r := recover(); r != nil {
			p.log.Error("membership poll panicked", slog.Any("panic", r))
		}
	}()
	down := map[string]bool{} // hosts that did not answer the last poll (logged on change)
	tick := time.NewTimer(0)
	defer tick.Stop()
	for {
		select {
		case <-p.ctx.Done():
			return
		case <-tick.C:
		}
		members := p.poll(down)
		if p.ctx.Err() != nil {
			return // shut down meanwhile: publish nothing
		}
		if len(members) > 0 { // not even this member answered: keep the last topology
			update(members)
		}
		tick.Reset(p.refresh)
	}
}

// poll asks every host at once and returns the members of this cluster that answered.
func (p *memberProvider) poll(down map[string]bool) cluster.Members {
	nodes := make([]*providerNode, len(p.hosts))
	errs := make([]error, len(p.hosts))
	var wg sync.WaitGroup
	for i, h := range p.hosts {
		wg.Go(func() { nodes[i], errs[i] = p.get(h) })
	}
	wg.Wait()
	var members cluster.Members
	for i, n := range nodes {
		if was := down[p.hosts[i]]; (errs[i] != nil) != was && p.ctx.Err() == nil {
			if errs[i] != nil {
				p.log.Warn("cluster member does not answer", slog.String("member", p.hosts[i]), slog.Any("error", errs[i]))
			} else {
				p.log.Info("cluster member answers again", slog.String("member", p.hosts[i]))
			}
		}
		down[p.hosts[i]] = errs[i] != nil
		if n == nil || n.ClusterName != p.name {
			continue
		}
		members = append(members, &cluster.Member{Id: n.ID, Host: n.Address, Port: int32(n.Port), Kinds: n.Kinds})
	}
	return members
}

// get reads host's node.
func (p *memberProvider) get(host string) (*providerNode, error) {
	req, err := http.NewRequestWithContext(p.ctx, http.MethodGet, "http://"+host+"/_health", nil)
	if err != nil {
		return nil, err
	}
	resp, err := p.client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("status %d", resp.StatusCode)
	}
	var n providerNode
	if err := json.NewDecoder(io.LimitReader(resp.Body, maxProviderNode)).Decode(&n); err != nil {
		return nil, fmt.Errorf("cannot decode its node: %w", err)
	}
	return &n, nil
}
