package httpfront

import (
	"crypto/subtle"

	"github.com/valyala/fasthttp"
)

// checkKey enforces a bearer key when key is set.
func checkKey(ctx *fasthttp.RequestCtx, key string) *apiError {
	if key == "" {
		return nil
	}
	h := ctx.Request.Header.Peek(fasthttp.HeaderAuthorization)
	const prefix = "Bearer "
	if len(h) <= len(prefix) || !equalFoldASCII(h[:len(prefix)], prefix) {
		return errMissingKey
	}
	if subtle.ConstantTimeCompare(h[len(prefix):], []byte(key)) != 1 {
		return errWrongKey
	}
	return nil
}

func equalFoldASCII(b []byte, s string) bool {
	if len(b) != len(s) {
		return false
	}
	for i := range b {
		c, d := b[i], s[i]
		if c|0x20 != d|0x20 {
			return false
		}
	}
	return true
}
