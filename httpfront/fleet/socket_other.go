//go:build !unix

package fleet

import "syscall"

// rawSockets says whether NewSocket makes Sockets: only where read(2) and write(2) of a
// nonblocking socket are the system calls SysRead and SysWrite make (Unix). Elsewhere the
// router's connections stay the runtime's.
const rawSockets = false

// SysRead is not available here (see rawSockets); it reads nothing and reports ENOSYS.
func SysRead(fd uintptr, b []byte) (int, syscall.Errno) { return 0, syscall.ENOSYS }

// SysWrite is not available here (see rawSockets); it writes nothing and reports ENOSYS.
func SysWrite(fd uintptr, b []byte) (int, syscall.Errno) { return 0, syscall.ENOSYS }
