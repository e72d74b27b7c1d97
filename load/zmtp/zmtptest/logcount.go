package zmtptest

import (
	"context"
	"log/slog"
	"slices"
	"sync"
)

// LogCounter is a slog.Handler that keeps, for each record with one message, its "count"
// attribute (-1 when it has none): the rate-limited warnings a subscriber logs about a
// hostile or broken peer say how many messages they stand for.
type LogCounter struct {
	msg    string
	mu     sync.Mutex
	counts []int64
}

// NewLogCounter returns a handler that counts the records whose message is msg.
func NewLogCounter(msg string) *LogCounter { return &LogCounter{msg: msg} }

// Enabled implements slog.Handler: every level.
func (h *LogCounter) Enabled(context.Context, slog.Level) bool { return true }

// WithAttrs implements slog.Handler; the attributes are not kept.
func (h *LogCounter) WithAttrs([]slog.Attr) slog.Handler { return h }

// WithGroup implements slog.Handler; the group is not kept.
func (h *LogCounter) WithGroup(string) slog.Handler { return h }

// Handle implements slog.Handler.
func (h *LogCounter) Handle(_ context.Context, r slog.Record) error {
	if r.Message != h.msg {
		return nil
	}
	n := int64(-1)
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == "count" {
			n = a.Value.Int64()
		}
		return true
	})
	h.mu.Lock()
	h.counts = append(h.counts, n)
	h.mu.Unlock()
	return nil
}

// Lines returns the "count" of each record counted so far, in order.
func (h *LogCounter) Lines() []int64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.counts)
}
