package httpfront

import (
	"log/slog"
	"testing"
	"time"

	"github.com/VictoriaMetrics/metrics"

	"switchyard/config"
)

// TestSlotMayFreeWakesItsModel: an event that may free an adapter slot on an engine of one
// model wakes the requests waiting for adapters of that model, not another's; one of a
// model not configured, or with nobody waiting, closes nothing.
func TestSlotMayFreeWakesItsModel(t *testing.T) {
	cfg := config.Default()
	cfg.LoRA.Enabled = true
	cfg.Models = map[string]config.Model{"llama": {}, "qwen": {}}
	l := newLoRARouting(cfg, metrics.NewSet(), slog.New(slog.DiscardHandler), time.Now)
	closed := func(model string) bool {
		r := l.room[model]
		r.mu.Lock()
		defer r.mu.Unlock()
		select {
		case <-r.freed:
			return true
		default:
			return false
		}
	}
	llama, qwen := l.room["llama"], l.room["qwen"]
	llama.waiters.Add(1)
	qwen.waiters.Add(1)
	llamaFreed, qwenFreed := llama.freed, qwen.freed
	genLlama, genQwen := l.slotGeneration("llama"), l.slotGeneration("qwen")

	l.slotMayFree("mistral") // no such model: nobody to wake
	l.slotMayFree("qwen")
	select {
	case <-qwenFreed:
	default:
		t.Fatal("qwen's waiters were not woken")
	}
	select {
	case <-llamaFreed:
		t.Fatal("an event on a qwen engine woke llama's waiters")
	default:
	}
	if l.slotGeneration("llama") != genLlama || l.slotGeneration("qwen") != genQwen+1 {
		t.Fatalf("generations llama %d qwen %d, want %d and %d", l.slotGeneration("llama"), l.slotGeneration("qwen"), genLlama, genQwen+1)
	}
	if closed("qwen") {
		t.Fatal("qwen's next wake-up is closed already")
	}

	llama.waiters.Add(-1)
	l.slotMayFree("llama") // nobody waits: counted, nothing closed
	if l.slotGeneration("llama") != genLlama+1 || llama.freed != llamaFreed {
		t.Fatal("an event with nobody waiting was not counted, or replaced the wake-up")
	}
	var none *loraRouting
	none.slotMayFree("llama") // LoRA routing off
}
