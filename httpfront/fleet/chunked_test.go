package fleet

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"net/http/httputil"
	"strings"
	"testing"
)

// decodeAll feeds body to a chunkDecoder in pieces of at most step bytes (0: whole) and
// returns the data, whether the body ended, the bytes past its end and the error.
func decodeAll(body []byte, step int) (data []byte, done bool, past int, err error) {
	var d chunkDecoder
	rest := append([]byte(nil), body...)
	for len(rest) > 0 {
		k := len(rest)
		if step > 0 && k > step {
			k = step
		}
		piece := rest[:k]
		n, used, derr := d.decode(piece)
		data = append(data, piece[:n]...)
		if derr != nil {
			return data, false, 0, derr
		}
		if d.done() {
			return data, true, len(rest) - used, nil
		}
		if used != k {
			return data, false, 0, errors.New("decode left bytes unused before the body's end")
		}
		rest = rest[k:]
	}
	return data, d.done(), 0, nil
}

func TestChunkDecoder(t *testing.T) {
	long := strings.Repeat("x", 5000)
	tests := []struct {
		name     string
		body     string
		want     string
		wantDone bool
		wantPast int
		wantErr  error
	}{
		{"one chunk", "5\r\nhello\r\n0\r\n\r\n", "hello", true, 0, nil},
		{"many chunks, upper and lower case hex", "3\r\nabc\r\nA\r\n0123456789\r\na\r\n0123456789\r\n0\r\n\r\n", "abc01234567890123456789", true, 0, nil},
		{"leading zeros", "0005\r\nhello\r\n000\r\n\r\n", "hello", true, 0, nil},
		{"extensions skipped", "5;name=value;x\r\nhello\r\n2 ; q=\"a b\"\r\nhi\r\n0;last\r\n\r\n", "hellohi", true, 0, nil},
		{"trailers skipped", "5\r\nhello\r\n0\r\nX-Tokens: 12\r\nX-Other: y\r\n\r\n", "hello", true, 0, nil},
		{"empty body", "0\r\n\r\n", "", true, 0, nil},
		{"bytes past the end", "2\r\nhi\r\n0\r\n\r\nHTTP/1.1", "hi", true, 8, nil},
		{"unfinished: no last chunk yet", "5\r\nhello\r\n3\r\nab", "helloab", false, 0, nil},
		{"a data CR and LF inside the data", "4\r\n\r\n\r\n\r\n0\r\n\r\n", "\r\n\r\n", true, 0, nil},
		{"bad hex", "zz\r\nhello\r\n", "", false, 0, errChunkSizeDigit},
		{"no size", "\r\nhello\r\n", "", false, 0, errChunkSizeDigit},
		{"negative size", "-5\r\nhello\r\n", "", false, 0, errChunkSizeDigit},
		{"size of 16 hex digits", "1000000000000000\r\n", "", false, 0, errChunkSizeLong},
		{"size that would overflow", "ffffffffffffffff0\r\n", "", false, 0, errChunkSizeLong},
		{"a character after the size", "5x\r\nhello\r\n", "", false, 0, errChunkSizeChar},
		{"bare LF after the size", "5\nhello\r\n", "", false, 0, errChunkLineLF},
		{"LF inside an extension", "5;a\nb\r\nhello\r\n", "", false, 0, errChunkLineLF},
		{"CR without LF after the size", "5\rhello\r\n", "", false, 0, errChunkLineCRLF},
		{"extension past its bound", "5;" + long + "\r\nhello\r\n", "", false, 0, errChunkLineLong},
		{"data not followed by CRLF", "5\r\nhelloX\r\n", "hello", false, 0, errChunkCRLF},
		{"data followed by a bare LF", "5\r\nhello\n0\r\n\r\n", "hello", false, 0, errChunkCRLF},
		{"data longer than its size", "3\r\nhello\r\n", "hel", false, 0, errChunkCRLF},
		{"trailer with a bare LF", "0\r\nX: y\n\r\n", "", false, 0, errChunkLineLF},
		{"trailer line with CR then no LF", "0\r\nX: y\rZ\r\n\r\n", "", false, 0, errChunkLineCRLF},
		{"trailers past their bound", "0\r\nX: " + long + "\r\n\r\n", "", false, 0, errTrailerLong},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// Whole, then cut at every size of piece: the result never depends on the cuts.
			for step := range len(tt.body) + 1 {
				data, done, past, err := decodeAll([]byte(tt.body), step)
				if !errors.Is(err, tt.wantErr) || tt.wantErr != nil && !errors.Is(err, ErrBadChunk) {
					t.Fatalf("step %d: error %v, want %v", step, err, tt.wantErr)
				}
				if string(data) != tt.want || done != tt.wantDone || past != tt.wantPast {
					t.Fatalf("step %d: data %q done %v past %d; want %q %v %d", step, data, done, past, tt.want, tt.wantDone, tt.wantPast)
				}
			}
		})
	}
}

// TestChunkedFraming: the framing follower finds the same end as the decoder, cut at every
// point, and leaves the bytes it reads as they came.
func TestChunkedFraming(t *testing.T) {
	for _, tt := range []struct {
		name     string
		body     string
		wantUsed int // -1: not done
		wantErr  bool
	}{
		{"chunks, extension and trailer, then the next answer", "5;x\r\nhello\r\n0\r\nT: v\r\n\r\nHTTP/1.1", 23, false},
		{"unfinished", "5\r\nhel", -1, false},
		{"bare LF", "5\nhello\r\n", -1, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			for cut := range len(tt.body) + 1 {
				var f ChunkedFraming
				in := []byte(tt.body)
				scratch := make([]byte, len(in))
				off, used, done := 0, 0, false
				var err error
				for _, part := range [][]byte{in[:cut], in[cut:]} {
					if len(part) == 0 || done || err != nil {
						continue
					}
					used, done, err = f.Feed(part, scratch)
					if done {
						used += off
					}
					off += len(part)
				}
				if string(in) != tt.body {
					t.Fatalf("cut %d: Feed changed its input to %q", cut, in)
				}
				if tt.wantErr {
					if !errors.Is(err, ErrBadChunk) {
						t.Fatalf("cut %d: error %v", cut, err)
					}
					continue
				}
				if err != nil || done != (tt.wantUsed >= 0) || done && used != tt.wantUsed {
					t.Fatalf("cut %d: used %d done %v err %v, want %d", cut, used, done, err, tt.wantUsed)
				}
			}
		})
	}
}

// FuzzChunkDecoder: whatever an engine sends, cut into whatever reads, the decoder neither
// panics nor reads past its input, gives the same data and verdict as when the bytes come
// at once, and never accepts a body whose data Go's own chunked reader reads otherwise.
// Its seeds (testdata/fuzz/FuzzChunkDecoder) hold every malformed case of TestChunkDecoder.
func FuzzChunkDecoder(f *testing.F) {
	f.Add([]byte("5\r\nhello\r\n0\r\n\r\n"), []byte{1, 3, 2})
	f.Add([]byte("5;x=y\r\nhello\r\n0\r\nT: v\r\n\r\n"), []byte{7})
	f.Fuzz(func(t *testing.T, body, cuts []byte) {
		data, done, past, err := decodeAll(body, 0)
		// The same bytes cut into pieces: the sizes of the pieces come from cuts.
		var d chunkDecoder
		var cut []byte
		rest := append([]byte(nil), body...)
		var cerr error
		for i := 0; len(rest) > 0 && cerr == nil && !d.done(); i++ {
			k := len(rest)
			if i < len(cuts) {
				k = min(k, int(cuts[i])+1)
			}
			piece := rest[:k]
			n, used, derr := d.decode(piece)
			if n > used || used > k {
				t.Fatalf("decode returned %d bytes of data from %d used of %d", n, used, k)
			}
			cut = append(cut, piece[:n]...)
			cerr = derr
			rest = rest[used:]
		}
		if !bytes.Equal(cut, data) || (cerr == nil) != (err == nil) || d.done() != done || done && len(rest) != past {
			t.Fatalf("cut reads: %q %v %v, whole: %q %v %v", cut, cerr, d.done(), data, err, done)
		}
		if err != nil && !errors.Is(err, ErrBadChunk) {
			t.Fatalf("error %v does not wrap ErrBadChunk", err)
		}
		if !done {
			return
		}
		// A body the decoder accepts reads the same through Go's chunked reader.
		ref, rerr := io.ReadAll(httputil.NewChunkedReader(bufio.NewReader(bytes.NewReader(body))))
		if rerr != nil || !bytes.Equal(ref, data) {
			t.Fatalf("accepted %q as %q; Go's chunked reader: %q, %v", body, data, ref, rerr)
		}
	})
}
