package httpfront

import (
	"context"
	"encoding/json"
	"log/slog"
	"time"

	"switchyard/actors"
	"switchyard/engine"
)

// Cluster wiring: with cluster.enabled the server joins the other router replicas (see
// actors.Cluster). The cluster is then the affinity store, adds the other replicas'
// in-flight and dispatch counts to every worker's counters, and carries the admin API's
// worker changes both ways: a change made here is published, a change made elsewhere is
// applied here through the same add/remove path. Workers of the Kubernetes discovery are
// not published: every replica watches the pods itself, and a removal published by another
// replica does not remove a worker this replica's discovery added.

// affinityStore is what the server needs of its binding store: the local
// actors.AffinityStore, or the cluster's partition grains.
type affinityStore interface {
	engine.AffinityStore
	InvalidateWorker(workerID string) (int, error)
	RunSweeper(ctx context.Context, ticks <-chan time.Time)
	Close()
}

// newAffinityStore builds the server's binding store: the cluster when cluster.enabled,
// else the local store.
func (s *Server) newAffinityStore(aopts actors.AffinityOptions) (affinityStore, error) {
	if !s.cfg.Cluster.Enabled {
		return actors.NewAffinityStore(aopts), nil
	}
	cl, err := actors.NewCluster(s.sys, s.cfg.Cluster, actors.ClusterOptions{
		Affinity:       aopts,
		Counters:       s.workerCounters,
		OnWorkerChange: s.applyWorkerChange,
		// The cluster joins before the fleet exists; its callbacks wait until New is done.
		Ready:   s.built,
		Metrics: s.opts.Metrics,
		Logger:  s.logger,
	})
	if err != nil {
		return nil, err
	}
	s.cluster = cl
	return cl, nil
}

// workerCounters returns every worker's router-local counters.
func (s *Server) workerCounters() map[string]actors.CountersOf {
	out := map[string]actors.CountersOf{}
	if s.wset == nil {
		return out
	}
	for _, w := range s.wset.Load().Workers() {
		out[w.ID] = w.Counters
	}
	return out
}

// publishWorkerChange shares an admin change with the other replicas.
func (s *Server) publishWorkerChange(id string, removed bool, spec *WorkerSpec) {
	if s.cluster == nil {
		return
	}
	var b []byte
	if spec != nil {
		sp := *spec
		sp.ID = id
		b, _ = json.Marshal(sp)
	}
	s.cluster.PublishWorkerChange(id, removed, b)
}

// applyWorkerChange applies a worker change made on another replica. It runs on the
// cluster's gossip goroutine, never before New has built the server (s.built); adding a
// worker introspects it (bounded by health.timeout).
func (s *Server) applyWorkerChange(wc actors.WorkerChange) {
	if s.workers == nil {
		return
	}
	if wc.Removed {
		if s.workers.Member(wc.WorkerID) == nil {
			return
		}
		if s.discovery != nil && s.discovery.Owns(wc.WorkerID) {
			// Every replica discovers the pods itself: the worker follows its pod here.
			s.logger.Info("worker removed by another replica kept: this replica discovered it", slog.String("worker", wc.WorkerID),
				slog.String("origin", wc.Origin))
			return
		}
		s.removeWorker(wc.WorkerID)
		s.logger.Info("worker removed by another replica", slog.String("worker", wc.WorkerID), slog.String("origin", wc.Origin))
		return
	}
	var spec WorkerSpec
	if err := json.Unmarshal(wc.Spec, &spec); err != nil || spec.ID != wc.WorkerID {
		s.logger.Warn("cannot apply a worker change from another replica", slog.String("worker", wc.WorkerID), slog.Any("error", err))
		return
	}
	if s.workers.Member(spec.ID) != nil {
		return
	}
	if spec.Model == "" {
		// Added by URL alone over there: this replica learns the model from the engine too.
		if _, err := s.workers.AddLater(spec); err != nil {
			s.logger.Warn("cannot add the worker another replica added", slog.String("worker", spec.ID), slog.Any("error", err))
		}
		return
	}
	if _, err := s.workers.Add(context.Background(), spec, true); err != nil {
		s.logger.Warn("cannot add the worker another replica added", slog.String("worker", spec.ID), slog.Any("error", err))
		return
	}
	s.logger.Info("worker added by another replica", slog.String("worker", spec.ID), slog.String("origin", wc.Origin))
}

// removeWorker removes a worker from the fleet (registry, health, telemetry, KV
// subscription) and its bindings.
func (s *Server) removeWorker(id string) error {
	if err := s.workers.Remove(id); err != nil {
		return err
	}
	if n, err := s.affinity.InvalidateWorker(id); err != nil {
		s.logger.Warn("cannot invalidate the removed worker's affinity bindings", slog.String("worker", id), slog.Any("error", err))
	} else if n > 0 {
		s.logger.Info("invalidated affinity bindings", slog.String("worker", id), slog.Int("bindings", n))
	}
	return nil
}

// leaveCluster hands this replica's partitions to the other replicas, bounded by
// cluster.handoff_timeout. The server calls it once the HTTP drain is over.
func (s *Server) leaveCluster() {
	if s.cluster == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), s.cfg.Cluster.HandoffTimeout)
	defer cancel()
	if err := s.cluster.Leave(ctx); err != nil {
		s.logger.Error("cluster hand-off incomplete", slog.Any("error", err))
		return
	}
	s.logger.Info("left the cluster; bindings handed off")
}

// Cluster returns the cluster this replica belongs to, or nil.
func (s *Server) Cluster() *actors.Cluster { return s.cluster }
