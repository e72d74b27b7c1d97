package load

import (
	"context"
	"log/slog"
	"time"
)

// MalformedLogInterval is how often one engine's malformed telemetry is logged at most.
const MalformedLogInterval = 10 * time.Second

// LogThrottle logs a repeating problem of one source (one engine's malformed KV events or
// load gauges) at most once per interval, each line carrying the number of occurrences
// since the previous line (attribute "count"), so that a flood of garbage costs one line per
// interval, not one per message. The zero Every is MalformedLogInterval; a nil Now is
// time.Now. A LogThrottle is owned by one goroutine.
type LogThrottle struct {
	Logger *slog.Logger
	Msg    string
	Every  time.Duration
	Now    func() time.Time

	last   time.Time
	count  int
	logged bool
}

// Note counts one occurrence and logs it, with the count, when the interval since the
// last line has passed (or there was none).
func (t *LogThrottle) Note(err error, attrs ...slog.Attr) {
	t.count++
	now := time.Now
	if t.Now != nil {
		now = t.Now
	}
	every := t.Every
	if every <= 0 {
		every = MalformedLogInterval
	}
	at := now()
	if t.logged && at.Sub(t.last) < every {
		return
	}
	t.logged, t.last = true, at
	attrs = append(attrs, slog.Any("error", err), slog.Int("count", t.count))
	t.count = 0
	if t.Logger != nil {
		t.Logger.LogAttrs(context.Background(), slog.LevelWarn, t.Msg, attrs...)
	}
}
