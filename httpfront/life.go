package httpfront

import (
	"context"
	"log/slog"
	"sync"
)

// lifecycle holds a Server's parts in the order they were started and stops them in
// reverse: what was started last (and may use everything before it) stops first. New
// records each part as it builds it, so a failure part-way stops exactly what was built;
// Run adds its background loops and stops the whole stack when it returns.
type lifecycle struct {
	logger *slog.Logger
	mu     sync.Mutex
	parts  []lifePart
	done   bool
}

// lifePart is one started part and how to stop it.
type lifePart struct {
	name string
	stop func()
}

// add records a started part; stop runs once, when the lifecycle stops. Adding to a stopped
// lifecycle stops the part at once.
func (l *lifecycle) add(name string, stop func()) {
	l.mu.Lock()
	if !l.done {
		l.parts = append(l.parts, lifePart{name: name, stop: stop})
		l.mu.Unlock()
		return
	}
	l.mu.Unlock()
	l.stopPart(lifePart{name: name, stop: stop})
}

// spawn runs fn on a goroutine the lifecycle owns: stopping the part cancels fn's context
// and waits for fn to return. A panic in fn is recovered and logged.
func (l *lifecycle) spawn(name string, fn func(ctx context.Context)) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer func() {
			if r := recover(); r != nil {
				l.logger.Error("background loop panicked", slog.String("part", name), slog.Any("panic", r))
			}
		}()
		fn(ctx)
	}()
	l.add(name, func() {
		cancel()
		<-done
	})
}

// stop stops every part in reverse order of addition. Later calls do nothing.
func (l *lifecycle) stop() {
	l.mu.Lock()
	parts := l.parts
	l.parts, l.done = nil, true
	l.mu.Unlock()
	for i := len(parts) - 1; i >= 0; i-- {
		l.stopPart(parts[i])
	}
}

// stopPart runs one stop function; a panic is logged so the parts before it still stop.
func (l *lifecycle) stopPart(p lifePart) {
	defer func() {
		if r := recover(); r != nil {
			l.logger.Error("stopping a part panicked", slog.String("part", p.name), slog.Any("panic", r))
		}
	}()
	p.stop()
}
