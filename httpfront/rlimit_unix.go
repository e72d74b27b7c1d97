//go:build unix

package httpfront

import "syscall"

// openFileLimit is the process's soft limit on open files, or 0 when unknown.
func openFileLimit() int64 {
	var r syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &r); err != nil {
		return 0
	}
	return int64(min(r.Cur, 1<<40))
}
