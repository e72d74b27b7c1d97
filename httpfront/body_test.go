package httpfront

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
	"testing"

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

func TestDecodeRoundTripAndLimit(t *testing.T) {
	var d decoders
	payload := []byte(strings.Repeat(`{"model":"m","prompt":"abc"}`, 1000))
	for _, name := range []string{"gzip", "deflate", "deflate-raw", "br", "zstd"} {
		enc := map[string]encoding{"gzip": encGzip, "deflate": encDeflate, "deflate-raw": encDeflate, "br": encBrotli, "zstd": encZstd}[name]
		t.Run(name, func(t *testing.T) {
			c, err := testEncode(name, payload)
			if err != nil {
				t.Fatal(err)
			}
			for round := 0; round < 2; round++ { // the second round reuses pooled decoders
				got, err := d.decode(nil, enc, c, int64(len(payload)))
				if err != nil || !bytes.Equal(got, payload) {
					t.Fatalf("round %d: err %v, %d bytes", round, err, len(got))
				}
			}
			got, err := d.decode(nil, enc, c, int64(len(payload)-1))
			if !errors.Is(err, errBodyTooLarge) {
				t.Fatalf("one byte over the limit: err %v", err)
			}
			if int64(len(got)) > int64(len(payload)) {
				t.Fatalf("kept %d bytes past a limit of %d", len(got), len(payload)-1)
			}
		})
	}
}

func TestReadLimitedGrowsWithinLimit(t *testing.T) {
	src := bytes.NewReader(make([]byte, 10000))
	got, err := readLimited(nil, src, 5000)
	if !errors.Is(err, errBodyTooLarge) || cap(got) > 5001+4096 {
		t.Fatalf("err %v cap %d", err, cap(got))
	}
}
