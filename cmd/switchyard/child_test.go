package main

import (
	"bufio"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Child processes for the hostile-client tests: the switchyard binary, built once per test
// run without the race detector (so that memory figures are the router's own), started with
// an optional open-file limit, its output read line by line, and stopped at the end of the
// test that started it.

var builtBinary struct {
	once sync.Once
	dir  string
	path string
	err  error
}

func TestMain(m *testing.M) {
	code := m.Run()
	if builtBinary.dir != "" {
		_ = os.RemoveAll(builtBinary.dir)
	}
	os.Exit(code)
}

// switchyardBinary builds cmd/switchyard once and returns its path.
func switchyardBinary(t testing.TB) string {
	t.Helper()
	builtBinary.once.Do(func() {
		goTool := filepath.Join(runtime.GOROOT(), "bin", "go")
		if _, err := os.Stat(goTool); err != nil {
			if goTool, err = exec.LookPath("go"); err != nil {
				builtBinary.err = fmt.Errorf("no go tool to build the router: %w", err)
				return
			}
		}
		if builtBinary.dir, builtBinary.err = os.MkdirTemp("", "switchyard-hostile-"); builtBinary.err != nil {
			return
		}
		builtBinary.path = filepath.Join(builtBinary.dir, "switchyard")
		out, err := exec.Command(goTool, "build", "-o", builtBinary.path, ".").CombinedOutput()
		if err != nil {
			builtBinary.err = fmt.Errorf("cannot build the router: %v\n%s", err, out)
		}
	})
	if builtBinary.err != nil {
		t.Fatal(builtBinary.err)
	}
	return builtBinary.path
}

// child is a running switchyard process.
type child struct {
	cmd   *exec.Cmd
	lines chan string
	exit  chan struct{} // closed when the process has exited
	mu    sync.Mutex
	out   strings.Builder // everything it printed, for failure messages
}

// startChild runs the switchyard binary with args; nofile > 0 lowers its open-file limit
// (soft and hard, so the Go runtime cannot raise it) before it starts. The process is
// stopped (SIGTERM, then SIGKILL) at the end of the test.
func startChild(t testing.TB, nofile int, args ...string) *child {
	t.Helper()
	return startChildBin(t, switchyardBinary(t), nofile, args...)
}

// startChildBin is startChild running the binary bin (another build of switchyard).
func startChildBin(t testing.TB, bin string, nofile int, args ...string) *child {
	t.Helper()
	var cmd *exec.Cmd
	if nofile > 0 {
		cmd = exec.Command("sh", append([]string{"-c", `ulimit -n ` + strconv.Itoa(nofile) + ` && exec "$0" "$@"`, bin}, args...)...)
	} else {
		cmd = exec.Command(bin, args...)
	}
	// The benchmarks' own knobs (SWITCHYARD_BENCH_*) are not the router's configuration,
	// which refuses unknown SWITCHYARD_ variables.
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "SWITCHYARD_BENCH_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = pw, pw
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pw.Close()
	c := &child{cmd: cmd, lines: make(chan string, 4096), exit: make(chan struct{})}
	read := make(chan struct{})
	go func() {
		defer close(read)
		sc := bufio.NewScanner(pr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			c.mu.Lock()
			c.out.WriteString(sc.Text() + "\n")
			c.mu.Unlock()
			select {
			case c.lines <- sc.Text():
			default:
			}
		}
	}()
	go func() {
		_ = cmd.Wait()
		<-read
		pr.Close()
		close(c.exit)
	}()
	t.Cleanup(func() { c.stop(t) })
	return c
}

// stop ends the process: SIGTERM, then SIGKILL after 30 s.
func (c *child) stop(t testing.TB) {
	select {
	case <-c.exit:
		return
	default:
	}
	_ = c.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-c.exit:
	case <-time.After(30 * time.Second):
		t.Errorf("%s did not stop on SIGTERM; killing it", c.cmd.Path)
		_ = c.cmd.Process.Kill()
		<-c.exit
	}
}

// kill ends the process at once, as a crash or an OOM kill does.
func (c *child) kill() {
	_ = c.cmd.Process.Kill()
	<-c.exit
}

func (c *child) exited() bool {
	select {
	case <-c.exit:
		return true
	default:
		return false
	}
}

func (c *child) output() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.out.String()
}

// waitLine waits (bounded) for an output line matching re and returns its submatches.
func (c *child) waitLine(t testing.TB, re *regexp.Regexp) []string {
	t.Helper()
	timeout := time.After(60 * time.Second)
	for {
		select {
		case line := <-c.lines:
			if m := re.FindStringSubmatch(line); m != nil {
				return m
			}
		case <-c.exit:
			t.Fatalf("%s exited before printing %s:\n%s", c.cmd.Path, re, c.output())
		case <-timeout:
			t.Fatalf("%s printed no %s in 60s:\n%s", c.cmd.Path, re, c.output())
		}
	}
}

// peakRSS is the process's peak resident set (VmHWM), in bytes.
func (c *child) peakRSS(t *testing.T) int64 {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(c.cmd.Process.Pid) + "/status")
	if err != nil {
		t.Skipf("no /proc status to read the peak RSS from: %v", err)
	}
	m := regexp.MustCompile(`VmHWM:\s+(\d+) kB`).FindSubmatch(b)
	if m == nil {
		t.Skip("no VmHWM in /proc status")
	}
	kb, _ := strconv.ParseInt(string(m[1]), 10, 64)
	return kb << 10
}

var servingLine = regexp.MustCompile(`switchyard serving on (http://\S+)`)

// startRouterChild runs `switchyard serve` on a loopback port chosen by the OS, with args
// added, and waits until it is ready. It returns the process and its base URL.
func startRouterChild(t testing.TB, nofile int, args ...string) (*child, string) {
	t.Helper()
	c := startChild(t, nofile, append([]string{"serve", "--host", "127.0.0.1", "--port", "0", "--log-level", "warn"}, args...)...)
	url := c.waitLine(t, servingLine)[1]
	waitReady(t, url)
	return c, url
}

var mockLine = regexp.MustCompile(`mockengine \S+ listening on (http://\S+)`)

// startMockChild runs `switchyard mockengine` on a port chosen by the OS, without KV events
// or load gauges, and returns the process and its URL.
func startMockChild(t *testing.T, args ...string) (*child, string) {
	t.Helper()
	c := startChild(t, 0, append([]string{"mockengine", "--port", "0", "--kv-events", "off", "--load-publish", "off",
		"--log-level", "warn"}, args...)...)
	return c, c.waitLine(t, mockLine)[1]
}

// fakeUpstream is an engine written in the test with net/http: /health answers 200, and
// inference requests go to answer. It lets a test misbehave the way engines do.
func fakeUpstream(t *testing.T, answer http.HandlerFunc) *httptest.Server {
	t.Helper()
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/health":
			return
		case "/v1/chat/completions", "/v1/completions", "/generate":
			_, _ = io.Copy(io.Discard, r.Body)
			answer(w, r)
		default:
			http.NotFound(w, r)
		}
	}))
	srv.Start()
	t.Cleanup(func() {
		srv.CloseClientConnections()
		srv.Close()
	})
	return srv
}
