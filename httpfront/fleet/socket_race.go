//go:build race && unix

package fleet

import "syscall"

// SysRead is read(2) through syscall.Read under the race detector: its annotations order a
// socket's write before the read of it in the same process (see Socket).
func SysRead(fd uintptr, b []byte) (int, syscall.Errno) {
	n, err := syscall.Read(int(fd), b)
	return n, errnoOf(err)
}

// SysWrite is write(2) through syscall.Write under the race detector (see SysRead).
func SysWrite(fd uintptr, b []byte) (int, syscall.Errno) {
	n, err := syscall.Write(int(fd), b)
	return n, errnoOf(err)
}

// errnoOf is err as an errno; nil is 0.
func errnoOf(err error) syscall.Errno {
	if err == nil {
		return 0
	}
	if e, ok := err.(syscall.Errno); ok {
		return e
	}
	return syscall.EIO
}
