//go:build unix

package reference

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"strings"
	"time"
)

// StartBareProcess starts the bare proxy as its own process, in front of engineURLs:
// command is the program and its first arguments (switchyard bare-proxy, which runs
// BareCommand; a program that runs another, such as valgrind, may come first);
// "--listen-fd 3 --engines URLs" are appended. The listening socket is opened here on
// 127.0.0.1 (a port chosen by the OS) and handed over as fd 3, as nginx's is. ExternalCPU
// is the process's own CPU time.
func StartBareProcess(command []string, engineURLs []string, opts ProcessOptions) (*Proxy, error) {
	return startProxyProcess("bare", command, engineURLs, opts)
}

// StartEvloopProcess starts the event-loop proxy as its own process (switchyard
// evloop-proxy, which runs EvloopCommand), as StartBareProcess starts the bare proxy.
func StartEvloopProcess(command []string, engineURLs []string, opts ProcessOptions) (*Proxy, error) {
	return startProxyProcess("evloop", command, engineURLs, opts)
}

// startProxyProcess starts command, a proxy process named name that takes --listen-fd and
// --engines, on a listening socket opened here and handed over as fd 3.
func startProxyProcess(name string, command []string, engineURLs []string, opts ProcessOptions) (*Proxy, error) {
	if len(command) == 0 || command[0] == "" {
		return nil, fmt.Errorf("cannot start the %s proxy process: no command", name)
	}
	if len(engineURLs) == 0 {
		return nil, fmt.Errorf("cannot start the %s proxy process: %w", name, errNoEngine)
	}
	lf, addr, err := listenerFile()
	if err != nil {
		return nil, fmt.Errorf("cannot start the %s proxy process: %w", name, err)
	}
	defer lf.Close()
	args := append(slices.Clone(command[1:]), "--listen-fd", "3", "--engines", strings.Join(engineURLs, ","))
	var stderr strings.Builder
	cmd := exec.Command(command[0], args...)
	cmd.ExtraFiles = []*os.File{lf} // fd 3
	cmd.Stdout, cmd.Stderr = io.Discard, &limitedWriter{w: &stderr, n: 4 << 10}
	url := "http://" + addr
	stop, err := runProcess(name+" proxy", cmd, url, opts)
	if err != nil {
		return nil, fmt.Errorf("cannot start the %s proxy process: %w (stderr: %s)", name, err, strings.TrimSpace(stderr.String()))
	}
	pid := cmd.Process.Pid
	return &Proxy{
		name:  name,
		url:   url,
		close: stop,
		cpu:   func() (time.Duration, bool) { return ProcessTreeCPU(pid) },
	}, nil
}
