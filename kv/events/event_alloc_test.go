//go:build !race

package events

import (
	"testing"
)

func TestDecoderAllocs(t *testing.T) {
	payload, err := AppendEventBatch(nil, benchBatch(32, 4, 16), ShapeArray)
	if err != nil {
		t.Fatal(err)
	}
	var d Decoder
	var b EventBatch
	if err := d.Decode(payload, &b); err != nil { // warm the buffers
		t.Fatal(err)
	}
	if n := testing.AllocsPerRun(50, func() {
		if err := d.Decode(payload, &b); err != nil {
			t.Fatal(err)
		}
	}); n != 0 {
		t.Errorf("Decode allocates %v times per batch, want 0", n)
	}
	e := NewEncoder()
	if _, err := e.Encode(&b, ShapeArray); err != nil {
		t.Fatal(err)
	}
	if n := testing.AllocsPerRun(50, func() {
		if _, err := e.Encode(&b, ShapeMap); err != nil {
			t.Fatal(err)
		}
	}); n != 0 {
		t.Errorf("Encode allocates %v times per batch, want 0", n)
	}
}
