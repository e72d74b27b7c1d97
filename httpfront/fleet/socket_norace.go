//go:build !race

package fleet

import (
	"syscall"
	"unsafe"
)

// sysRead is read(2) of a nonblocking socket, raw: it never blocks, so the scheduler is not
// told (see Socket).
func sysRead(fd uintptr, b []byte) (int, syscall.Errno) {
	n, _, errno := syscall.RawSyscall(syscall.SYS_READ, fd, uintptr(unsafe.Pointer(unsafe.SliceData(b))), uintptr(len(b)))
	return int(n), errno
}

// sysWrite is write(2) of a nonblocking socket, raw (see sysRead).
func sysWrite(fd uintptr, b []byte) (int, syscall.Errno) {
	n, _, errno := syscall.RawSyscall(syscall.SYS_WRITE, fd, uintptr(unsafe.Pointer(unsafe.SliceData(b))), uintptr(len(b)))
	return int(n), errno
}
