//go:build !unix

package reference

import (
	"errors"
	"time"
)

// ErrNoNginx: nginx is run on unix systems only.
var ErrNoNginx = errors.New("no nginx here (unix only)")

// NginxBinary returns ErrNoNginx.
func NginxBinary() (string, error) { return "", ErrNoNginx }

// NginxOptions are StartNginx's settings.
type NginxOptions struct {
	Binary    string
	Keepalive int
}

// StartNginx returns ErrNoNginx.
func StartNginx([]string, NginxOptions) (*Proxy, error) { return nil, ErrNoNginx }

// ProcessOptions adjust the waits of a proxy process (unix only).
type ProcessOptions struct {
	StartTimeout time.Duration
	StopTimeout  time.Duration
}

// StartBareProcess returns an error: proxy processes are run on unix systems only.
func StartBareProcess([]string, []string, ProcessOptions) (*Proxy, error) {
	return nil, errors.New("cannot start the bare proxy process: unix only")
}

// StartEvloopProcess returns an error: proxy processes are run on unix systems only.
func StartEvloopProcess([]string, []string, ProcessOptions) (*Proxy, error) {
	return nil, errors.New("cannot start the evloop proxy process: unix only")
}
