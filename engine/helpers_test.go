package engine

import (
	"math/rand/v2"
	"testing"
)

// testWorkers builds n healthy workers of model m and stage s with IDs prefix0..prefix(n-1).
func testWorkers(t testing.TB, model string, s Stage, prefix string, n int) []*Worker {
	t.Helper()
	out := make([]*Worker, n)
	for i := range out {
		out[i] = NewWorker(prefix+string(rune('0'+i%10))+string(rune('a'+i/10%26))+string(rune('a'+i/260)), "http://127.0.0.1:1", model, s, nil)
	}
	return out
}

func mustSet(t testing.TB, ws ...[]*Worker) *WorkerSet {
	t.Helper()
	var all []*Worker
	for _, w := range ws {
		all = append(all, w...)
	}
	s, err := NewWorkerSet(all)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func testRNG() *rand.Rand { return rand.New(rand.NewPCG(1, 2)) }

// fixedPolicy returns the worker chosen by fn.
type fixedPolicy struct {
	fn    func(c []*Worker, req *PickRequest) (Pick, error)
	calls int
}

func (p *fixedPolicy) Name() string { return "fixed" }
func (p *fixedPolicy) Pick(c []*Worker, req *PickRequest) (Pick, error) {
	p.calls++
	return p.fn(c, req)
}

func breq(model string, input, peak int64) *BucketRequest {
	return &BucketRequest{Model: model, InputTokens: input, ExpectedPeak: peak}
}

// pickEngines is one bucket's complete selection on the caller's goroutine: the stages
// Bucket.FirstStage and PickStage name, in turn (what the bucket's actors do in the router).
func pickEngines(b *Bucket, reg *Registry, req *BucketRequest) (BucketPick, error) {
	if err := b.Check(); err != nil {
		return BucketPick{}, err
	}
	var sel BucketPick
	for stage, more := b.FirstStage(), true; more; {
		var err error
		if stage, more, err = b.PickStage(reg, req, stage, &sel); err != nil {
			return BucketPick{}, err
		}
	}
	return sel, nil
}

// selectEngines runs the bucket loop over buckets with attempt as each bucket's selection.
func selectEngines(buckets []*Bucket, req *BucketRequest, attempt func(*Bucket) (BucketPick, error)) (BucketPick, error) {
	loop := StartBucketLoop(buckets, req)
	for b := loop.Next(); b != nil; b = loop.Next() {
		pick, err := attempt(b)
		if done, err := loop.Attempted(b, pick, err); done {
			if err != nil {
				return BucketPick{}, err
			}
			return pick, nil
		}
	}
	return BucketPick{}, loop.Err()
}
