package actors

import (
	"log/slog"
	"maps"
	"slices"
	"time"

	"github.com/asynkron/protoactor-go/cluster"
	"google.golang.org/protobuf/proto"

	"switchyard/actors/clusterpb"
)

// gossipLoop publishes this replica's counters every gossip interval (when they changed)
// and applies the worker changes gossip brought, one at a time, off the gossip actor. Until
// ClusterOptions.Ready closes it calls neither callback; the round it closes in applies
// what was learnt meanwhile.
func (c *Cluster) gossipLoop() {
	defer c.wg.Done()
	ticks := c.opts.Ticks
	if ticks == nil {
		t := time.NewTicker(c.cfg.GossipInterval)
		defer t.Stop()
		ticks = t.C
	}
	ready := c.opts.Ready
	if c.ready.Load() {
		ready = nil
	}
	var last *clusterpb.InflightCounts
	for {
		select {
		case <-c.stop:
			return
		case <-ready:
		case <-ticks:
		}
		if ready != nil {
			select {
			case <-ready:
				ready = nil
				c.ready.Store(true)
				c.applyPeers() // the counts gossiped before
			default:
				continue
			}
		}
		func() {
			defer func() {
				if r := recover(); r != nil {
					c.logger.Error("cluster gossip loop panicked", slog.Any("panic", r))
				}
			}()
			if cur := c.localCounts(); !proto.Equal(cur, last) {
				c.c.Gossip.SetState(gossipInflight, cur)
				last = cur
			}
			c.applyChanges()
		}()
	}
}

// localCounts returns this replica's router-local counters of every worker.
func (c *Cluster) localCounts() *clusterpb.InflightCounts {
	out := &clusterpb.InflightCounts{Workers: map[string]*clusterpb.WorkerCounts{}}
	if c.opts.Counters == nil {
		return out
	}
	for id, w := range c.opts.Counters() {
		out.Workers[id] = &clusterpb.WorkerCounts{Inflight: w.LocalInFlight(), Dispatched: w.LocalDispatched()}
	}
	return out
}

// onGossip handles one gossip update (on the gossip actor's goroutine: it must not block).
func (c *Cluster) onGossip(u *cluster.GossipUpdate) {
	if u.MemberID == c.MemberID() || u.Value == nil {
		return
	}
	switch u.Key {
	case gossipInflight:
		var m clusterpb.InflightCounts
		if u.Value.UnmarshalTo(&m) != nil {
			return
		}
		c.mu.Lock()
		c.peers[u.MemberID] = &m
		c.mu.Unlock()
		c.applyPeers()
	case gossipWorkers:
		var m clusterpb.WorkerChanges
		if u.Value.UnmarshalTo(&m) != nil {
			return
		}
		c.mu.Lock()
		for _, ch := range m.Changes {
			wc := WorkerChange{WorkerID: ch.WorkerId, Removed: ch.Removed, Spec: ch.SpecJson, Version: ch.Version, Origin: ch.Origin}
			if newer(wc, c.changes[wc.WorkerID]) {
				c.changes[wc.WorkerID] = wc
				c.pending = append(c.pending, wc)
			}
		}
		c.mu.Unlock()
	case gossipLeaving:
		var m clusterpb.LeavingMembers
		if u.Value.UnmarshalTo(&m) != nil {
			return
		}
		c.mu.Lock()
		c.leavingAcks[u.MemberID] = m.Ids
		learnt := false
		for _, id := range m.Ids {
			if !c.leaving[id] {
				c.leaving[id] = true
				learnt = true
			}
		}
		c.mu.Unlock()
		c.poke()
		if learnt {
			c.refreshPlacement()
			c.publishLeaving() // the acknowledgement the leaving replica waits for
		}
	}
}

// newer reports whether a supersedes b (the latest version wins; ties go to the greater
// origin).
func newer(a, b WorkerChange) bool {
	if b.WorkerID == "" {
		return true
	}
	if a.Version != b.Version {
		return a.Version > b.Version
	}
	return a.Origin > b.Origin
}

// applyPeers adds the other replicas' counts into every worker's counters (once ready:
// before, the counts are only kept).
func (c *Cluster) applyPeers() {
	if c.opts.Counters == nil || !c.ready.Load() {
		return
	}
	// One at a time (the event stream's and the gossip loop's), so that a sum made earlier
	// never overwrites a later one.
	c.applying.Lock()
	defer c.applying.Unlock()
	c.mu.Lock()
	inflight := map[string]int64{}
	dispatched := map[string]uint64{}
	for _, pc := range c.peers {
		for id, w := range pc.Workers {
			inflight[id] += w.Inflight
			dispatched[id] += w.Dispatched
		}
	}
	c.mu.Unlock()
	for id, w := range c.opts.Counters() {
		w.SetPeers(inflight[id], dispatched[id])
	}
}

// PublishWorkerChange shares a worker change made through this replica's admin API; every
// other replica applies it (ClusterOptions.OnWorkerChange) unless it knows a later change of
// the same worker.
func (c *Cluster) PublishWorkerChange(workerID string, removed bool, spec []byte) {
	c.mu.Lock()
	v := max(time.Now().UnixNano(), c.changes[workerID].Version+1)
	c.changes[workerID] = WorkerChange{WorkerID: workerID, Removed: removed, Spec: spec, Version: v, Origin: c.MemberID()}
	state := c.changesState()
	c.mu.Unlock()
	c.c.Gossip.SetState(gossipWorkers, state)
}

// changesState is the gossip state of every change known; c.mu is held.
func (c *Cluster) changesState() *clusterpb.WorkerChanges {
	ids := slices.Sorted(maps.Keys(c.changes))
	out := &clusterpb.WorkerChanges{Changes: make([]*clusterpb.WorkerChange, 0, len(ids))}
	for _, id := range ids {
		wc := c.changes[id]
		out.Changes = append(out.Changes, &clusterpb.WorkerChange{WorkerId: wc.WorkerID, Removed: wc.Removed, SpecJson: wc.Spec,
			Version: wc.Version, Origin: wc.Origin})
	}
	return out
}

// applyChanges hands the changes gossip brought to OnWorkerChange, and republishes the
// merged state so that a replica joining later learns them from any member.
func (c *Cluster) applyChanges() {
	if c.left.Load() {
		return // leaving: the fleet is no longer this replica's to change
	}
	c.mu.Lock()
	todo := c.pending
	c.pending = nil
	var state *clusterpb.WorkerChanges
	if len(todo) > 0 {
		state = c.changesState()
	}
	c.mu.Unlock()
	if state == nil {
		return
	}
	c.c.Gossip.SetState(gossipWorkers, state)
	if c.opts.OnWorkerChange == nil {
		return
	}
	for _, wc := range todo {
		c.opts.OnWorkerChange(wc)
	}
}
