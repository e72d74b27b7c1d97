package mix

import "testing"

// TestMix64 pins the function to splitmix64's published output: the generator's first
// outputs from seed 0 are Mix64 of its state advanced by the golden gamma each step.
func TestMix64(t *testing.T) {
	const gamma = 0x9e3779b97f4a7c15
	want := []uint64{0xe220a8397b1dcdaf, 0x6e789e6aa1b965f4, 0x06c45d188009454f}
	var s uint64
	for i, w := range want {
		s += gamma
		if got := Mix64(s); got != w {
			t.Fatalf("output %d = %#x, want %#x", i, got, w)
		}
	}
	if Mix64(0) != 0 {
		t.Fatal("Mix64(0) != 0")
	}
}
