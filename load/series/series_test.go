package series

import (
	"bytes"
	"strings"
	"testing"
)

func TestName(t *testing.T) {
	tests := []struct {
		name   string
		family string
		pairs  []string
		want   string
	}{
		{"no labels", "x_total", nil, "x_total"},
		{"one", "x_total", []string{"worker", "W1"}, `x_total{worker="W1"}`},
		{"two", "x", []string{"model", "m", "stage", "prefill"}, `x{model="m",stage="prefill"}`},
		{"escaped", "x", []string{"model", "a\"b\\c\nd"}, `x{model="a\"b\\c\nd"}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := Name(tt.family, tt.pairs...); got != tt.want {
				t.Fatalf("Name = %s, want %s", got, tt.want)
			}
		})
	}
}

func TestNameOddPairsPanics(t *testing.T) {
	defer func() {
		if r := recover(); r == nil || !strings.HasPrefix(r.(string), "BUG:") {
			t.Fatalf("recovered %v, want a BUG panic", r)
		}
	}()
	Name("x", "worker")
}

func TestOwnedKindsAndUnregister(t *testing.T) {
	o := Own(nil)
	o.Counter(`a_total{k="v"}`).Add(3)
	o.Gauge("b", func() float64 { return 2 })
	o.Histogram("c_seconds", []float64{0.1, 1}).Update(0.5)
	var out bytes.Buffer
	o.Set().WritePrometheus(&out)
	for _, want := range []string{`a_total{k="v"} 3`, "b 2", `c_seconds_bucket{le="1"} 1`, `c_seconds_bucket{le="0.1"} 0`} {
		if !strings.Contains(out.String(), want+"\n") {
			t.Errorf("exposition lacks %q:\n%s", want, out.String())
		}
	}
	o.Unregister()
	out.Reset()
	o.Set().WritePrometheus(&out)
	if out.Len() != 0 {
		t.Fatalf("after Unregister the set still exposes:\n%s", out.String())
	}
}
