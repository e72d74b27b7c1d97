package mockengine

import (
	"testing"
	"time"
)

func TestManualClock(t *testing.T) {
	start := time.Unix(100, 0)
	c := NewManualClock(start)
	a, b, x := c.NewTimer(3*time.Second), c.NewTimer(time.Second), c.NewTimer(2*time.Second)
	if now := c.NewTimer(0); len(now.C()) != 1 {
		t.Fatal("a zero timer did not fire at once")
	}
	if !x.Stop() || x.Stop() {
		t.Fatal("Stop of a pending timer")
	}
	if c.Pending() != 2 {
		t.Fatalf("%d pending", c.Pending())
	}
	if d, err := c.AdvanceToNext(t.Context()); err != nil || d != time.Second {
		t.Fatalf("AdvanceToNext = %v, %v", d, err)
	}
	if got := <-b.C(); !got.Equal(start.Add(time.Second)) {
		t.Fatalf("b fired at %v", got)
	}
	c.Advance(5 * time.Second)
	if got := <-a.C(); !got.Equal(start.Add(3 * time.Second)) {
		t.Fatalf("a fired at %v, want its deadline", got)
	}
	if !c.Now().Equal(start.Add(6 * time.Second)) {
		t.Fatalf("now %v", c.Now())
	}
	select {
	case <-x.C():
		t.Fatal("a stopped timer fired")
	default:
	}
	ctx, cancel := contextWithCancel(t)
	cancel()
	if err := c.WaitForTimers(ctx, 1); err == nil {
		t.Fatal("WaitForTimers ignored its context")
	}
}
