package actors

import (
	"log/slog"

	"github.com/asynkron/protoactor-go/actor"

	"switchyard/engine"
)

// newActorSystem returns an actor system whose own logging (start-up, supervision, dead
// letters) goes to logger, tagged lib=protoactor. No metrics provider is configured, so
// Proto.Actor's OpenTelemetry/Prometheus instruments stay off; Switchyard's metrics read
// Counters instead.
func newActorSystem(logger *slog.Logger) *actor.ActorSystem {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return actor.NewActorSystem(
		actor.WithLoggerFactory(func(sys *actor.ActorSystem) *slog.Logger {
			return logger.With(slog.String("lib", "protoactor"), slog.String("system", sys.ID))
		}),
		actor.WithDeadLetterRequestLogging(false),
	)
}

// subscribeDeadLetters answers every rejecter that reaches a stopped actor with err, so a
// send racing with shutdown fails at once instead of waiting for its deadline.
func subscribeDeadLetters(sys *actor.ActorSystem, err *engine.PickError) {
	sys.EventStream.Subscribe(func(evt any) {
		if dl, ok := evt.(*actor.DeadLetterEvent); ok {
			if r, ok := dl.Message.(rejecter); ok {
				r.reject(err)
			}
		}
	})
}
