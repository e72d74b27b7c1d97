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
// BareCommand); "--listen-fd 3 --engines URLs" are appended. The listening socket is opened
// here on 127.0.0.1 (a port chosen by the OS) and handed over as fd 3, as nginx's is.
// ExternalCPU is the process's own CPU time.
func StartBareProcess(command []string, engineURLs []string) (*Proxy, error) {
	if len(command) == 0 || command[0] == "" {
		return nil, fmt.Errorf("cannot start the bare proxy process: no command")
	}
	if len(engineURLs) == 0 {
		return nil, fmt.Errorf("cannot start the bare proxy process: %w", errNoEngine)
	}
	lf, addr, err := listenerFile()
	if err != nil {
		return nil, fmt.Errorf("cannot start the bare proxy process: %w", err)
	}
	defer lf.Close()
	args := append(slices.Clone(command[1:]), "--listen-fd", "3", "--engines", strings.Join(engineURLs, ","))
	var stderr strings.Builder
	cmd := exec.Command(command[0], args...)
	cmd.ExtraFiles = []*os.File{lf} // fd 3
	cmd.Stdout, cmd.Stderr = io.Discard, &limitedWriter{w: &stderr, n: 4 << 10}
	url := "http://" + addr
	stop, err := runProcess("bare proxy", cmd, url)
	if err != nil {
		return nil, fmt.Errorf("cannot start the bare proxy process: %w (stderr: %s)", err, strings.TrimSpace(stderr.String()))
	}
	pid := cmd.Process.Pid
	return &Proxy{
		name:  "bare",
		url:   url,
		close: stop,
		cpu:   func() (time.Duration, bool) { return ProcessTreeCPU(pid) },
	}, nil
}
