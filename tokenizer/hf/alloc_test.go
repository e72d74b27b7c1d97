//go:build !race

package hf

import "testing"

// TestEncodeAllocations locks in the allocation budget of the request path: encoding text
// whose pieces and chunks are cached, into a slice with room, allocates nothing.
func TestEncodeAllocations(t *testing.T) {
	tk := loadTiny(t, Options{})
	short := "<|im_start|>user\nhello world, the answer is 42!<|im_end|>\n"
	long := ""
	for len(long) < 4*minChunk {
		long += "hello world the end\nthe answer in the end\n"
	}
	for _, tt := range []struct {
		name string
		text string
	}{{"short", short}, {"long", long}} {
		dst := tk.AppendEncode(nil, tt.text) // warm the caches
		allocs := testing.AllocsPerRun(100, func() {
			dst = tk.AppendEncode(dst[:0], tt.text)
		})
		if allocs != 0 {
			t.Errorf("%s: AppendEncode allocates %.1f times per call, want 0", tt.name, allocs)
		}
	}
}
