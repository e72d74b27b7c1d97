//go:build !race

package index

import (
	"context"
	"fmt"
	"runtime"
	"testing"

	"switchyard/kv"
)

// TestLookupAllocations locks in the allocation budget of a lookup once its pools are warm:
// none, for a prompt nobody holds, a short one, and a 100,000-token one that streams (its
// helper's stream and start are pooled), with and without the hash cache.
//
// testing.AllocsPerRun runs on one thread, where a streamed lookup usually withdraws its
// helper before it ever runs; each run yields once after its lookup so that the withdrawn
// helper gets to exit and give its stream back.
func TestLookupAllocations(t *testing.T) {
	for _, cache := range streamCaches {
		x, prompt, _ := streamFixture(t, cache)
		tests := []struct {
			name   string
			tokens []uint32
			want   int // tokens "full" holds
		}{
			{"miss", seqTokens(1<<31, 100_000), 0},
			{"short", prompt[:2000], 2000},
			{"streamed", prompt, 100_000},
		}
		for _, tt := range tests {
			t.Run(fmt.Sprintf("cache=%d/%s", cache, tt.name), func(t *testing.T) {
				var l kv.Lookup
				run := func() {
					if err := x.Lookup(context.Background(), "m", tt.tokens, &l); err != nil {
						t.Fatal(err)
					}
					runtime.Gosched() // a withdrawn helper exits
				}
				run() // warm the pools and the hash cache
				if n := testing.AllocsPerRun(50, run); n != 0 {
					t.Errorf("a lookup allocates %v times, want 0", n)
				}
				if got := l.Tokens("full"); got != int64(tt.want) {
					t.Errorf("full holds %d tokens, want %d", got, tt.want)
				}
			})
		}
	}
}
