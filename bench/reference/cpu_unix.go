//go:build unix

package reference

import (
	"syscall"
	"time"
)

// ProcessCPU returns the CPU time (user + system) this process has used so far; false when
// it cannot be known.
func ProcessCPU() (time.Duration, bool) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0, false
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), true
}
