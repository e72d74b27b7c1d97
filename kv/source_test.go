package kv

import (
	"slices"
	"testing"
)

// TestLookupNormalize: one match per worker, sorted, the best of its entries with the ranks
// of every entry holding as much; empty entries dropped.
func TestLookupNormalize(t *testing.T) {
	l := Lookup{Matches: []Match{
		{Worker: "b", Tokens: 64, Ranks: RankBit(0)},
		{Worker: "a", Tokens: 32, Ranks: RankBit(2)},
		{Worker: "b", Tokens: 128, Ranks: RankBit(1)},
		{Worker: "b", Tokens: 128, Ranks: RankBit(3)},
		{Worker: "c", Tokens: 0, Ranks: RankBit(0)},
		{Worker: "a", Tokens: 32, Ranks: RankBit(64)}, // a rank past 63: unnamed
	}}
	l.Normalize()
	want := []Match{{Worker: "a", Tokens: 32, Ranks: 1 << 2}, {Worker: "b", Tokens: 128, Ranks: 1<<1 | 1<<3}}
	if !slices.Equal(l.Matches, want) {
		t.Fatalf("%+v, want %+v", l.Matches, want)
	}
	if l.Ranks("b") != 1<<1|1<<3 || l.Ranks("z") != 0 || l.Tokens("a") != 32 {
		t.Fatal("Ranks or Tokens")
	}
}
