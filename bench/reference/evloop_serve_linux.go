//go:build linux

package reference

import (
	"net"
	"os"
	"sync"
	"syscall"
)

// evloopListener returns a listening socket's descriptor for the loop (which then owns
// it) and its address: the inherited fd when fd > 0, else a new socket on addr.
func evloopListener(fd int, addr string) (int, string, error) {
	if fd > 0 {
		sa, err := syscall.Getsockname(fd)
		if err != nil {
			return -1, "", err
		}
		return fd, sockaddrString(sa), nil
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return -1, "", err
	}
	defer ln.Close()
	f, err := ln.(*net.TCPListener).File()
	if err != nil {
		return -1, "", err
	}
	defer f.Close()
	dup, err := syscall.Dup(int(f.Fd()))
	if err != nil {
		return -1, "", os.NewSyscallError("dup", err)
	}
	syscall.CloseOnExec(dup)
	return dup, ln.Addr().String(), nil
}

func sockaddrString(sa syscall.Sockaddr) string {
	switch a := sa.(type) {
	case *syscall.SockaddrInet4:
		return (&net.TCPAddr{IP: net.IP(a.Addr[:]), Port: a.Port}).String()
	case *syscall.SockaddrInet6:
		return (&net.TCPAddr{IP: net.IP(a.Addr[:]), Port: a.Port}).String()
	}
	return "?"
}

// serveEvloop runs the loop on lfd (which it owns from now on) on a goroutine of its own;
// stop wakes it, waits for it to close every socket and returns its error.
func serveEvloop(lfd int, engineURLs []string) (stop func() error, err error) {
	l, err := newEvLoop(lfd, engineURLs)
	if err != nil {
		return nil, err
	}
	done := make(chan error, 1)
	go func() { done <- l.run() }()
	var once sync.Once
	var runErr error
	return func() error {
		once.Do(func() {
			l.wake()
			runErr = <-done
			l.closeWake()
		})
		return runErr
	}, nil
}
