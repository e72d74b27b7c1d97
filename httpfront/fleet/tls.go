package fleet

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"

	"switchyard/config"
)

// ClientTLS is the client TLS of the router's https:// workers, read from the
// configuration's files: Global for every worker (nil: the system's roots, no client
// certificate), and Workers[i] for workers[i] when it overrides upstream.tls (nil when it
// does not).
type ClientTLS struct {
	Global  *tls.Config
	Workers []*tls.Config
	// Tracing is the client TLS towards the tracing collector (tracing.tls); nil: the
	// system's roots.
	Tracing *tls.Config
}

// LoadTLS reads the certificate authorities, client certificates and keys that
// upstream.tls, workers[].tls and tracing.tls name. Every problem is a *config.FieldError naming its
// key (a file that cannot be read, holds no certificate, or a key that does not match its
// certificate), joined with errors.Join. switchyard check and the router's start call it.
func LoadTLS(cfg *config.Config) (ClientTLS, error) {
	var out ClientTLS
	var errs []error
	out.Global = buildTLS(cfg.Upstream.TLS, "upstream.tls", &errs)
	out.Tracing = buildTLS(cfg.Tracing.TLS, "tracing.tls", &errs)
	out.Workers = make([]*tls.Config, len(cfg.Workers))
	for i, w := range cfg.Workers {
		if w.TLS.IsZero() {
			continue
		}
		// Each key the worker sets is reported under the worker's path, the rest under
		// upstream.tls's (already reported there).
		merged := cfg.Upstream.TLS.Merged(w.TLS)
		var werrs []error
		out.Workers[i] = buildTLS(merged, fmt.Sprintf("workers[%d].tls", i), &werrs)
		for _, e := range werrs {
			var fe *config.FieldError
			if errors.As(e, &fe) && !workerSets(w.TLS, fe.Path, i) {
				continue
			}
			errs = append(errs, e)
		}
	}
	return out, errors.Join(errs...)
}

// workerSets reports whether a problem at path (under workers[i].tls) comes from a key the
// worker sets itself.
func workerSets(t *config.UpstreamTLS, path string, i int) bool {
	prefix := fmt.Sprintf("workers[%d].tls.", i)
	switch key := path[len(prefix):]; {
	case len(key) >= len("ca_files") && key[:len("ca_files")] == "ca_files":
		return len(t.CAFiles) > 0
	case key == "cert_file", key == "key_file":
		return t.CertFile != "" || t.KeyFile != ""
	}
	return true
}

// buildTLS returns the client TLS configuration of t (nil when t sets nothing), reporting
// each problem under path.
func buildTLS(t config.UpstreamTLS, path string, errs *[]error) *tls.Config {
	if t.IsZero() {
		return nil
	}
	bad := func(key, msg string) {
		*errs = append(*errs, &config.FieldError{Path: path + "." + key, Msg: msg, Kind: config.ErrInvalid})
	}
	c := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: t.ServerName}
	if len(t.CAFiles) > 0 {
		pool, err := x509.SystemCertPool()
		if err != nil {
			pool = x509.NewCertPool() // no system roots here: only the configured ones
		}
		for i, f := range t.CAFiles {
			key := fmt.Sprintf("ca_files[%d]", i)
			pem, err := os.ReadFile(f)
			switch {
			case err != nil:
				bad(key, "cannot read the certificate authorities: "+err.Error())
			case !pool.AppendCertsFromPEM(pem):
				bad(key, fmt.Sprintf("%s holds no PEM certificate", f))
			}
		}
		c.RootCAs = pool
	}
	if t.CertFile != "" && t.KeyFile != "" {
		cert, err := tls.LoadX509KeyPair(t.CertFile, t.KeyFile)
		if err != nil {
			bad("cert_file", "cannot load the client certificate with key_file "+t.KeyFile+": "+err.Error())
		} else {
			c.Certificates = []tls.Certificate{cert}
		}
	}
	return c
}
