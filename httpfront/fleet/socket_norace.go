//go:build !race && unix

package fleet

import (
	"syscall"
	"unsafe"
)

// SysRead is read(2) of a nonblocking descriptor, raw: it never blocks, so the scheduler is
// not told (see Socket). Under the race detector it is syscall.Read.
func SysRead(fd uintptr, b []byte) (int, syscall.Errno) {
	n, _, errno := syscall.RawSyscall(syscall.SYS_READ, fd, uintptr(unsafe.Pointer(unsafe.SliceData(b))), uintptr(len(b)))
	return int(n), errno
}

// SysWrite is write(2) of a nonblocking descriptor, raw (see SysRead).
func SysWrite(fd uintptr, b []byte) (int, syscall.Errno) {
	n, _, errno := syscall.RawSyscall(syscall.SYS_WRITE, fd, uintptr(unsafe.Pointer(unsafe.SliceData(b))), uintptr(len(b)))
	return int(n), errno
}
