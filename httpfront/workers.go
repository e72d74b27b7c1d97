package httpfront

import (
	"errors"

	"switchyard/actors"
	"switchyard/engine"
	"switchyard/httpfront/fleet"
	"switchyard/load"
)

// The worker lifecycle (introspection, health checks, breakers, upstream clients, telemetry
// and KV subscriptions) is package httpfront/fleet; these names keep the Server's API.
type (
	// Telemetry starts and stops the load ingestion of one worker (fleet.Telemetry).
	Telemetry = fleet.Telemetry
	// TelemetrySource describes one worker to its telemetry (fleet.TelemetrySource).
	TelemetrySource = fleet.TelemetrySource
	// WorkerSpec describes a worker to add, from the configuration or POST /workers.
	WorkerSpec = fleet.Spec
)

// loadStatuser is implemented by a Telemetry that can say where a worker's load comes from,
// for GET /workers.
type loadStatuser interface {
	LoadStatus(id string) (actors.LoadStatus, bool)
}

// LoadSource implements fleet.LoadSourcer (the switchyard_worker_load_source gauges).
func (a actorTelemetry) LoadSource(id string) (load.Source, bool) {
	st, ok := a.t.Status(id)
	return st.Source, ok
}

var _ fleet.LoadSourcer = actorTelemetry{}

// Sentinel errors of the worker admin operations.
var (
	ErrWorkerExists   = fleet.ErrWorkerExists
	ErrWorkerNotFound = fleet.ErrWorkerNotFound
	ErrInvalidWorker  = fleet.ErrInvalidWorker
	ErrIntrospection  = fleet.ErrIntrospection
)

// upstreamFailure maps a failed exchange with engine w (before any byte reached the client)
// to the client's error, counts it, and says what it tells about the engine: the router's
// own failures (no free connection, no file descriptor) are never charged to the engine.
func (s *Server) upstreamFailure(w *engine.Worker, err error) (*apiError, fleet.Outcome) {
	var ue *fleet.Error
	if !errors.As(err, &ue) {
		s.metrics.upstreamError(w.ID, upstreamTransport)
		return newAPIError(CodeUpstream, "engine "+w.ID+" failed: "+err.Error()), fleet.OutcomeFailure
	}
	switch ue.Kind {
	case fleet.KindConnLimit:
		return newAPIError(CodeConnectionLimit, "engine "+w.ID+": "+ue.Detail), fleet.OutcomeNeutral
	case fleet.KindResources:
		return newAPIError(CodeRouterResources, "engine "+w.ID+": "+ue.Error()), fleet.OutcomeNeutral
	case fleet.KindTimeout:
		s.metrics.upstreamError(w.ID, upstreamTimeout)
		return newAPIError(CodeUpstreamTimeout, "engine "+w.ID+" "+ue.Detail), fleet.OutcomeFailure
	}
	s.metrics.upstreamError(w.ID, upstreamTransport)
	return newAPIError(CodeUpstream, "engine "+w.ID+" "+ue.Error()), fleet.OutcomeFailure
}

// statusOutcome counts an engine's answer status and says what it tells about the engine.
func (s *Server) statusOutcome(w *engine.Worker, status int) fleet.Outcome {
	if status >= 500 {
		s.metrics.upstreamError(w.ID, upstreamStatus)
	}
	return fleet.OutcomeOfStatus(status)
}
