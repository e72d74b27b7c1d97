package httpfront

import (
	"bytes"
	"log/slog"
	"testing"

	"github.com/valyala/fasthttp"
)

// TestHandleRecoversPanic checks that a route that panics fails only its own request, with a
// 500 and the internal error code, and that the panic is logged with the request's path.
func TestHandleRecoversPanic(t *testing.T) {
	var logs bytes.Buffer
	// A Server without its metrics: the health route's counter is a nil dereference.
	s := &Server{logger: slog.New(slog.NewTextHandler(&logs, nil))}
	var ctx fasthttp.RequestCtx
	ctx.Request.SetRequestURI("/health")
	s.handle(&ctx)
	if got := ctx.Response.StatusCode(); got != fasthttp.StatusInternalServerError {
		t.Fatalf("status %d, want 500", got)
	}
	if !bytes.Contains(ctx.Response.Body(), []byte(CodeInternal)) {
		t.Errorf("body %q lacks %q", ctx.Response.Body(), CodeInternal)
	}
	if !bytes.Contains(logs.Bytes(), []byte("request handler panicked")) || !bytes.Contains(logs.Bytes(), []byte("path=/health")) {
		t.Errorf("log %q lacks the panic and its path", logs.String())
	}
}
