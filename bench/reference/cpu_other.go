//go:build !linux

package reference

import "time"

// ProcessTreeCPU cannot be known outside Linux.
func ProcessTreeCPU(int) (time.Duration, bool) { return 0, false }
