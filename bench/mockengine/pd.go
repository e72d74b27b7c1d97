package mockengine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"
)

// maxRooms bounds the completed bootstrap rooms a prefill engine remembers.
const maxRooms = 65536

// roomInfo is what a prefill engine reports for a completed bootstrap room.
type roomInfo struct {
	Room         uint64 `json:"room"`
	Status       string `json:"status"`
	PromptTokens int    `json:"prompt_tokens"`
	CachedTokens int    `json:"cached_tokens"`
	// TransferBackend is the prefill engine's KV transfer backend.
	TransferBackend string `json:"transfer_backend,omitempty"`
	Error           string `json:"error,omitempty"`
}

// roomRegistry records the bootstrap rooms whose prefill finished, and wakes the decode
// engines waiting for them.
type roomRegistry struct {
	mu    sync.Mutex
	rooms map[uint64]*roomEntry
	done  []uint64 // completed rooms, oldest first, for forgetting
}

type roomEntry struct {
	ready   chan struct{}
	info    roomInfo
	settled bool
	waiters int
}

func newRoomRegistry() *roomRegistry {
	return &roomRegistry{rooms: make(map[uint64]*roomEntry)}
}

func (g *roomRegistry) entry(room uint64) *roomEntry {
	en := g.rooms[room]
	if en == nil {
		en = &roomEntry{ready: make(chan struct{})}
		g.rooms[room] = en
	}
	return en
}

func (g *roomRegistry) settle(room uint64, info roomInfo) {
	g.mu.Lock()
	defer g.mu.Unlock()
	en := g.entry(room)
	if en.settled {
		return
	}
	info.Room = room
	en.info, en.settled = info, true
	close(en.ready)
	g.done = append(g.done, room)
	if len(g.done) > maxRooms {
		delete(g.rooms, g.done[0])
		g.done = g.done[1:]
	}
}

func (g *roomRegistry) complete(room uint64, info roomInfo) {
	info.Status = "done"
	g.settle(room, info)
}

func (g *roomRegistry) fail(room uint64, msg string) {
	g.settle(room, roomInfo{Status: "failed", Error: msg})
}

// wait blocks until room settles or ctx is done.
func (g *roomRegistry) wait(ctx context.Context, room uint64) (roomInfo, bool) {
	g.mu.Lock()
	en := g.entry(room)
	en.waiters++
	g.mu.Unlock()
	defer func() {
		g.mu.Lock()
		en.waiters--
		if en.waiters == 0 && !en.settled && g.rooms[room] == en {
			delete(g.rooms, room) // nobody completed it: forget the placeholder
		}
		g.mu.Unlock()
	}()
	select {
	case <-en.ready:
		return en.info, true
	case <-ctx.Done():
		return roomInfo{}, false
	}
}

// reset forgets every settled room, as a restarted engine does. Rooms still awaited stay
// until their waiters give up.
func (g *roomRegistry) reset() {
	g.mu.Lock()
	defer g.mu.Unlock()
	for room, en := range g.rooms {
		if en.settled {
			delete(g.rooms, room)
		}
	}
	g.done = g.done[:0]
}

// bootstrapServer is a prefill engine's bootstrap HTTP server: decode engines long-poll
// GET /bootstrap/rooms/{room} until that room's prefill completes.
type bootstrapServer struct {
	srv  *http.Server
	ln   net.Listener
	port int
	done chan struct{}
}

func (e *Engine) startBootstrap(addr string) (*bootstrapServer, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })
	mux.HandleFunc("GET /bootstrap/rooms/{room}", e.serveRoom)
	b := &bootstrapServer{
		srv:  &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second, ErrorLog: slog.NewLogLogger(e.log.Handler(), slog.LevelWarn)},
		ln:   ln,
		port: ln.Addr().(*net.TCPAddr).Port,
		done: make(chan struct{}),
	}
	b.srv.BaseContext = func(net.Listener) context.Context { return e.ctx }
	go func() {
		defer close(b.done)
		_ = b.srv.Serve(ln)
	}()
	return b, nil
}

func (b *bootstrapServer) close() error {
	err := b.srv.Close()
	<-b.done
	return err
}

// serveRoom answers 200 with the room's roomInfo once its prefill completed, 409 when it
// failed; it waits until then or until the caller gives up.
func (e *Engine) serveRoom(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Worker-Id", e.workerID)
	room, err := strconv.ParseUint(r.PathValue("room"), 10, 63)
	if err != nil {
		w.WriteHeader(http.StatusBadRequest)
		_ = json.NewEncoder(w).Encode(roomInfo{Status: "invalid", Error: "room is not an integer in [0, 2^63-1]"})
		return
	}
	info, ok := e.rooms.wait(r.Context(), room)
	if !ok {
		return // the decode engine gave up or the engine is closing
	}
	if info.Status != "done" {
		w.WriteHeader(http.StatusConflict)
	}
	_ = json.NewEncoder(w).Encode(info)
}

// errTransfer marks a failed KV transfer: the decode request fails with a 500.
var errTransfer = errors.New("KV transfer failed")

// awaitPrefill is a decode engine's side of the handshake: it waits, at most PDTimeout on
// the engine's clock, until the prefill engine named by bi reports that it completed the
// room with the same prompt.
func (e *Engine) awaitPrefill(bi bootstrapInfo, promptLen int) (roomInfo, error) {
	port := e.cfg.DefaultBootstrapPort
	if bi.hasPort {
		port = bi.port
	}
	peer := net.JoinHostPort(strings.Trim(bi.host, "[]"), strconv.Itoa(port))
	fail := func(format string, args ...any) (roomInfo, error) {
		return roomInfo{}, fmt.Errorf("%w: cannot receive KV cache for bootstrap room %d from %s: %s",
			errTransfer, bi.room, peer, fmt.Sprintf(format, args...))
	}
	ctx, cancel := context.WithCancel(e.ctx)
	defer cancel()
	type result struct {
		info roomInfo
		err  error
	}
	res := make(chan result, 1)
	if !e.goTracked(func() {
		info, err := e.pollRoom(ctx, "http://"+peer+"/bootstrap/rooms/"+strconv.FormatUint(bi.room, 10))
		res <- result{info, err}
	}) {
		return roomInfo{}, errClosed
	}
	t := e.clock.NewTimer(e.cfg.PDTimeout)
	defer t.Stop()
	select {
	case r := <-res:
		if r.err != nil {
			return fail("%v", r.err)
		}
		if r.info.Status != "done" {
			return fail("prefill failed: %s", r.info.Error)
		}
		if r.info.PromptTokens != promptLen {
			return fail("prefill had %d prompt tokens, decode has %d", r.info.PromptTokens, promptLen)
		}
		if r.info.TransferBackend != e.cfg.TransferBackend {
			return fail("prefill engine's transfer backend %q is not this engine's %q", r.info.TransferBackend, e.cfg.TransferBackend)
		}
		return r.info, nil
	case <-t.C():
		cancel()
		<-res
		return fail("prefill did not complete within %v", e.cfg.PDTimeout)
	case <-e.ctx.Done():
		return roomInfo{}, errClosed
	}
}

func (e *Engine) pollRoom(ctx context.Context, url string) (roomInfo, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return roomInfo{}, err
	}
	resp, err := e.httpc.Do(req)
	if err != nil {
		return roomInfo{}, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
	if err != nil {
		return roomInfo{}, err
	}
	var info roomInfo
	if err := json.Unmarshal(body, &info); err != nil {
		return roomInfo{}, fmt.Errorf("bootstrap server answered %d with %.64q", resp.StatusCode, body)
	}
	if resp.StatusCode != http.StatusOK && resp.StatusCode != http.StatusConflict {
		return roomInfo{}, fmt.Errorf("bootstrap server answered %d: %s", resp.StatusCode, info.Error)
	}
	return info, nil
}
