package httpfront

import (
	"bytes"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/klauspost/compress/flate"
	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/zlib"
	"github.com/klauspost/compress/zstd"
	brotli "github.com/molecule-man/go-brrr"
)

// testEncode compresses b with the named Content-Encoding ("deflate-raw" is raw deflate).
func testEncode(enc string, b []byte) ([]byte, error) {
	var buf bytes.Buffer
	switch enc {
	case "gzip":
		w := gzip.NewWriter(&buf)
		_, _ = w.Write(b)
		err := w.Close()
		return buf.Bytes(), err
	case "deflate":
		w := zlib.NewWriter(&buf)
		_, _ = w.Write(b)
		err := w.Close()
		return buf.Bytes(), err
	case "deflate-raw":
		w, _ := flate.NewWriter(&buf, flate.DefaultCompression)
		_, _ = w.Write(b)
		err := w.Close()
		return buf.Bytes(), err
	case "br":
		return brotli.Compress(b, brotli.BestSpeed)
	case "zstd":
		w, _ := zstd.NewWriter(&buf)
		_, _ = w.Write(b)
		err := w.Close()
		return buf.Bytes(), err
	}
	return nil, fmt.Errorf("unknown encoding %q", enc)
}

func TestParseEncoding(t *testing.T) {
	tests := []struct {
		in   string
		want encoding
	}{
		{"", encIdentity}, {"identity", encIdentity}, {" GZIP ", encGzip}, {"x-gzip", encGzip},
		{"deflate", encDeflate}, {"br", encBrotli}, {"zstd", encZstd}, {"gzip, br", encUnknown}, {"lz4", encUnknown},
	}
	for _, tt := range tests {
		if got := parseEncoding([]byte(tt.in)); got != tt.want {
			t.Errorf("parseEncoding(%q) = %d, want %d", tt.in, got, tt.want)
		}
	}
}

// decodeAll decompresses c with d into a new body, at most limit bytes, under budget.
func decodeAll(t *testing.T, d *decoders, enc encoding, c []byte, limit int64, budget *bodyBudget) ([]byte, error) {
	t.Helper()
	r, put, err := d.reader(enc, bytes.NewReader(c))
	if err != nil {
		return nil, err
	}
	defer put()
	body, held, err := readChunks(nil, r, limit, budget, 0)
	budget.release(held)
	return body, err
}

func TestDecodeRoundTripAndLimit(t *testing.T) {
	var d decoders
	budget := newBodyBudget(1<<30, 0)
	payload := []byte(strings.Repeat(`{"model":"m","prompt":"abc"}`, 10000))
	for _, name := range []string{"gzip", "deflate", "deflate-raw", "br", "zstd"} {
		enc := map[string]encoding{"gzip": encGzip, "deflate": encDeflate, "deflate-raw": encDeflate, "br": encBrotli, "zstd": encZstd}[name]
		t.Run(name, func(t *testing.T) {
			c, err := testEncode(name, payload)
			if err != nil {
				t.Fatal(err)
			}
			for round := 0; round < 2; round++ { // the second round reuses pooled decoders
				got, err := decodeAll(t, &d, enc, c, int64(len(payload)), budget)
				if err != nil || !bytes.Equal(got, payload) {
					t.Fatalf("round %d: err %v, %d bytes", round, err, len(got))
				}
			}
			got, err := decodeAll(t, &d, enc, c, int64(len(payload)-1), budget)
			if !errors.Is(err, errBodyTooLarge) || len(got) != 0 {
				t.Fatalf("one byte over the limit: err %v, %d bytes", err, len(got))
			}
			if n := budget.used.Load(); n != 0 {
				t.Fatalf("%d bytes still charged to the budget", n)
			}
		})
	}
}

func TestReadChunksCharges(t *testing.T) {
	budget := newBodyBudget(4*bodyChunkSize, time.Hour)
	// Two chunks while reading, then the copy of the body: 2 chunks + the body.
	body, held, err := readChunks(nil, bytes.NewReader(make([]byte, bodyChunkSize+10)), 1<<20, budget, 0)
	if err != nil || len(body) != bodyChunkSize+10 || held != int64(len(body)) || budget.used.Load() != held {
		t.Fatalf("err %v, %d bytes, held %d, charged %d", err, len(body), held, budget.used.Load())
	}
	// What is left cannot hold three chunks (two full, one to see the end): the read fails
	// at once, without waiting (the budget's wait is an hour).
	_, _, err = readChunks(nil, bytes.NewReader(make([]byte, 2*bodyChunkSize)), 1<<20, budget, 0)
	if !errors.Is(err, errBudget) || budget.used.Load() != held {
		t.Fatalf("over the budget: err %v, charged %d", err, budget.used.Load())
	}
	budget.release(held)
	// Prepaid bytes are used first and what is not needed is released.
	if !budget.acquire(4 * bodyChunkSize) {
		t.Fatal("the whole budget refused")
	}
	body, held, err = readChunks(nil, bytes.NewReader(make([]byte, 100)), 1<<20, budget, 4*bodyChunkSize)
	if err != nil || len(body) != 100 || held != 100 || budget.used.Load() != 100 {
		t.Fatalf("prepaid: err %v, %d bytes, held %d, charged %d", err, len(body), held, budget.used.Load())
	}
	budget.release(held)
	if budget.used.Load() != 0 {
		t.Fatalf("charged %d after the release", budget.used.Load())
	}
}

func TestBodyBudgetWaitsForRelease(t *testing.T) {
	b := newBodyBudget(100, 10*time.Second)
	if !b.acquire(80) {
		t.Fatal("80 of 100 refused")
	}
	got := make(chan bool, 1)
	go func() { got <- b.acquire(50) }()
	for b.waiters.Load() == 0 {
		runtime.Gosched()
	}
	b.release(80)
	if !<-got {
		t.Fatal("a waiter was refused after the release")
	}
	short := newBodyBudget(10, time.Millisecond)
	if short.acquire(11) {
		t.Fatal("more than the whole budget granted")
	}
}
