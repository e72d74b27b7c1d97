//go:build !race

package actors

import (
	"bufio"
	"encoding/hex"
	"net"
	"os"
	"runtime"
	"strconv"
	"strings"
	"testing"
)

// listeningOn returns the local addresses of the TCP sockets of this machine listening on
// port, read from /proc/net/tcp and tcp6 (Linux).
func listeningOn(t *testing.T, port int) []net.IP {
	t.Helper()
	if runtime.GOOS != "linux" {
		t.Skip("reads /proc/net/tcp")
	}
	var out []net.IP
	for _, name := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		f, err := os.Open(name)
		if err != nil {
			if os.IsNotExist(err) {
				continue
			}
			t.Fatal(err)
		}
		sc := bufio.NewScanner(f)
		sc.Scan() // header
		for sc.Scan() {
			fields := strings.Fields(sc.Text())
			if len(fields) < 4 || fields[3] != "0A" { // 0A: LISTEN
				continue
			}
			ipHex, portHex, ok := strings.Cut(fields[1], ":")
			p, err := strconv.ParseUint(portHex, 16, 16)
			if !ok || err != nil || int(p) != port {
				continue
			}
			raw, err := hex.DecodeString(ipHex)
			if err != nil || (len(raw) != 4 && len(raw) != 16) {
				t.Fatalf("%s: bad local address %q", name, fields[1])
			}
			// The kernel writes each 32-bit word in host order (little-endian here).
			for i := 0; i < len(raw); i += 4 {
				raw[i], raw[i+1], raw[i+2], raw[i+3] = raw[i+3], raw[i+2], raw[i+1], raw[i]
			}
			out = append(out, net.IP(raw))
		}
		f.Close()
		if err := sc.Err(); err != nil {
			t.Fatal(err)
		}
	}
	return out
}

// TestClusterListensOnLoopbackOnly: a member whose cluster.listen host is 127.0.0.1 listens
// there only, the automanaged provider's port included (it listened on every interface).
func TestClusterListensOnLoopbackOnly(t *testing.T) {
	ports := freePorts(t, 1)
	ms := startMembersOf(t, ports, 1, func(int) SystemOptions { return SystemOptions{} })
	_, remotePort, err := ms[0].cl.c.ActorSystem.GetHostPort()
	if err != nil {
		t.Fatal(err)
	}
	for what, port := range map[string]int{"provider": ports[0], "remote": remotePort} {
		ips := listeningOn(t, port)
		if len(ips) == 0 {
			t.Fatalf("nothing listens on the %s port %d", what, port)
		}
		for _, ip := range ips {
			if !ip.IsLoopback() {
				t.Errorf("the %s port %d listens on %v, not on loopback only", what, port, ip)
			}
		}
	}
}

// TestClusterProviderPortTaken: a provider port already in use fails the start with an
// error naming cluster.provider_port (the provider only logged it and ran unreachable).
func TestClusterProviderPortTaken(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	port := ln.Addr().(*net.TCPAddr).Port
	m := newTestMember(SystemOptions{}, nil)
	defer m.close()
	err = m.start([]int{port}, 0)
	if err == nil || !strings.Contains(err.Error(), "cluster.provider_port") {
		t.Fatalf("start on a taken provider port: %v, want an error naming cluster.provider_port", err)
	}
}
