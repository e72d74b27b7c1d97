package httpfront

import (
	"context"
	"log/slog"

	"switchyard/httpfront/fleet"
)

// discoverySink is the worker lifecycle as Kubernetes discovery drives it: the same Add as
// POST /workers (with introspection) and the same removal as DELETE /workers/{id}.
type discoverySink struct{ s *Server }

var _ fleet.Sink = discoverySink{}

func (d discoverySink) AddWorker(ctx context.Context, spec fleet.Spec) error {
	_, err := d.s.workers.Add(ctx, spec, true)
	return err
}

func (d discoverySink) RemoveWorker(id string) error { return d.s.removeWorker(id) }

// newDiscovery builds the Kubernetes discovery when discovery.kubernetes.enabled.
func (s *Server) newDiscovery() (*fleet.Kubernetes, error) {
	if !s.cfg.Discovery.Kubernetes.Enabled {
		return nil, nil
	}
	return fleet.NewKubernetes(fleet.KubernetesOptions{
		Config:  s.cfg.Discovery.Kubernetes,
		Pods:    s.opts.DiscoveryPods,
		Sink:    discoverySink{s},
		Logger:  s.logger.With(slog.String("source", "kubernetes")),
		Metrics: s.set,
	})
}
