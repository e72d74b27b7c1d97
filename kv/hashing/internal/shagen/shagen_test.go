package shagen

import (
	"bytes"
	"os"
	"testing"
)

// TestGenerated checks that kv/hashing/sha256_amd64.s is what Generate writes.
func TestGenerated(t *testing.T) {
	have, err := os.ReadFile("../../sha256_amd64.s")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(have, Generate()) {
		t.Fatal("kv/hashing/sha256_amd64.s is stale: run go generate ./kv/hashing")
	}
}

func TestConstants(t *testing.T) {
	if iv := IV(); iv[0] != 0x6a09e667 || iv[7] != 0x5be0cd19 {
		t.Fatalf("IV = %x", iv)
	}
	if k := K(); k[0] != 0x428a2f98 || k[63] != 0xc67178f2 {
		t.Fatalf("K = %x ... %x", k[0], k[63])
	}
}
