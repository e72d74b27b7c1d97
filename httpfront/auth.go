package httpfront

import (
	"crypto/subtle"
	"net"

	"github.com/valyala/fasthttp"

	"switchyard/config"
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

// RouteAccess says what a group of routes requires of a request, as logged at start-up.
type RouteAccess struct {
	// Routes names the group: "data plane (/v1/*, /generate)", "admin (/workers, /flush_cache)", "/metrics".
	Routes string
	// Access is what protects them: a bearer key (and which), open (and why), or refused.
	Access string
	// Warn marks an exposure an operator should look at.
	Warn bool
}

// routeAccess is what a group of routes requires: a bearer key, nothing, or every request
// is refused.
type routeAccess struct {
	key     string    // the bearer key required; "" none
	refused *apiError // set: every request is refused with it
	desc    RouteAccess
}

func (a *routeAccess) check(ctx *fasthttp.RequestCtx) *apiError {
	if a.refused != nil {
		return a.refused
	}
	return checkKey(ctx, a.key)
}

var errAdminDisabled = newAPIError(CodeAdminDisabled, "the admin API is disabled: the router listens beyond "+
	"loopback with neither server.admin_api_key nor server.api_key set (set one, or server.admin_open: true)")

// accessRules derives what protects each group of routes from the configuration and the
// listen address. The admin API takes the admin key when set, else the data-plane key; with
// neither, it is open on a loopback listener or with server.admin_open, and refused
// otherwise, so that a router reachable from the network never lets anyone add an engine
// that receives prompts, or remove every engine, by accident.
func accessRules(cfg config.Server, addr net.Addr) (data, admin, metrics routeAccess) {
	loopback := isLoopback(addr)
	data = routeAccess{key: cfg.APIKey, desc: RouteAccess{Routes: "data plane (/v1/*, /generate)", Access: "bearer key server.api_key"}}
	if cfg.APIKey == "" {
		data.desc.Access = "open (no server.api_key)"
	}
	admin.desc.Routes = "admin (/workers, /flush_cache)"
	switch {
	case cfg.AdminAPIKey != "":
		admin.key, admin.desc.Access = cfg.AdminAPIKey, "bearer key server.admin_api_key"
	case cfg.APIKey != "":
		admin.key, admin.desc.Access = cfg.APIKey, "bearer key server.api_key (no server.admin_api_key)"
	case loopback:
		admin.desc.Access = "open (no key; listening on loopback only)"
	case cfg.AdminOpen:
		admin.desc.Access, admin.desc.Warn = "open to the network (server.admin_open, no key)", true
	default:
		admin.refused = errAdminDisabled
		admin.desc.Access, admin.desc.Warn = "refused (listening beyond loopback with no key; set server.admin_api_key, or server.admin_open: true)", true
	}
	metrics = routeAccess{key: cfg.MetricsAPIKey, desc: RouteAccess{Routes: "/metrics", Access: "bearer key server.metrics_api_key"}}
	if cfg.MetricsAPIKey == "" {
		metrics.desc.Access = "open (no server.metrics_api_key)"
	}
	return data, admin, metrics
}

// isLoopback reports whether a listener on addr is reachable from this host only.
func isLoopback(addr net.Addr) bool {
	switch a := addr.(type) {
	case *net.TCPAddr:
		return a.IP.IsLoopback()
	case *net.UnixAddr:
		return true
	}
	return false
}

// RouteAccess lists what protects each group of routes.
func (s *Server) RouteAccess() []RouteAccess {
	return []RouteAccess{s.dataAccess.desc, s.adminAccess.desc, s.metricsAccess.desc}
}
