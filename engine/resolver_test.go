package engine

import (
	"errors"
	"slices"
	"testing"
)

func ids(bs []*Bucket) []string {
	out := make([]string, len(bs))
	for i, b := range bs {
		out[i] = b.ID
	}
	return out
}

func bucket(id string, rank int, min, max, ctx int64) *Bucket {
	return &Bucket{ID: id, Rank: rank, MinInput: min, MaxInput: max, MaxContext: ctx}
}

func TestResolve(t *testing.T) {
	// The example of POLICY_DESIGN section 7.
	short := bucket("short-context", 10, 0, 4096, 8192)
	long := bucket("long-context", 20, 0, 131072, 131072)
	section7 := NewBucketResolver("llama", []*Bucket{long, short})

	tests := []struct {
		name        string
		r           *BucketResolver
		input, peak int64
		want        []string
		wantErr     error
	}{
		{"4k input 16k peak takes long", section7, 4096, 16384, []string{"long-context"}, nil},
		{"4k input 8k peak takes short first", section7, 4096, 8192, []string{"short-context", "long-context"}, nil},
		{"4k input 6k peak takes short first", section7, 4000, 6000, []string{"short-context", "long-context"}, nil},
		{"unknown peak checks input only", section7, 4096, -1, []string{"short-context", "long-context"}, nil},
		{"input above short max", section7, 4097, -1, []string{"long-context"}, nil},
		{"input at inclusive min", NewBucketResolver("m", []*Bucket{bucket("a", 0, 100, 200, Unbounded)}), 100, -1, []string{"a"}, nil},
		{"input below min", NewBucketResolver("m", []*Bucket{bucket("a", 0, 100, 200, Unbounded)}), 99, -1, nil, nil},
		{"nothing fits", section7, 200000, -1, nil, nil},
		{"peak equal input is fine", section7, 10, 10, []string{"short-context", "long-context"}, nil},
		{"peak below input is invalid", section7, 10, 9, nil, ErrInvalidSignal},
		{"negative input is invalid", section7, -1, -1, nil, ErrInvalidSignal},
		{"context exactly at capacity", section7, 4096, 8192, []string{"short-context", "long-context"}, nil},
		{"context one over capacity", section7, 4096, 8193, []string{"long-context"}, nil},
		{
			"capacity is min of input max and context",
			NewBucketResolver("m", []*Bucket{bucket("wide-input-small-ctx", 0, 0, 100000, 2000), bucket("small-input", 0, 0, 3000, Unbounded)}),
			100, -1, []string{"wide-input-small-ctx", "small-input"}, nil,
		},
		{
			"unbounded sorts last, then rank, then ID",
			NewBucketResolver("m", []*Bucket{
				bucket("u", 0, 0, Unbounded, Unbounded), bucket("b", 5, 0, 1000, Unbounded),
				bucket("a", 5, 0, 1000, Unbounded), bucket("r1", 1, 0, 1000, 1000), bucket("c", 0, 0, 500, 9999),
			}),
			10, -1, []string{"c", "r1", "a", "b", "u"}, nil,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := tt.r.Resolve(nil, tt.input, tt.peak)
			if tt.wantErr != nil {
				if !errors.Is(err, tt.wantErr) {
					t.Fatalf("err = %v, want %v", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(ids(got), tt.want) {
				t.Fatalf("got %v, want %v", ids(got), tt.want)
			}
		})
	}
}

func TestResolveAppendsWithoutAllocating(t *testing.T) {
	r := NewBucketResolver("m", []*Bucket{bucket("a", 0, 0, 10, 10), bucket("b", 0, 0, 100, 100)})
	buf := make([]*Bucket, 0, 4)
	allocs := testing.AllocsPerRun(100, func() {
		buf, _ = r.Resolve(buf[:0], 5, 8)
	})
	if allocs != 0 {
		t.Fatalf("Resolve allocated %.0f times", allocs)
	}
}
