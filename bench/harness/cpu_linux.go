//go:build linux

package harness

import (
	"bytes"
	"os"
	"strconv"
	"time"
)

// clockTicks is Linux's USER_HZ, the unit of /proc/PID/stat's CPU times (100 on every
// architecture Go supports).
const clockTicks = 100

// childCPU returns the CPU time (user + system) process pid has used so far, from
// /proc/PID/stat.
func childCPU(pid int) (time.Duration, bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, false
	}
	// The command name (field 2) is in parentheses and may hold spaces: count fields after
	// its closing one. utime and stime are fields 14 and 15.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, false
	}
	f := bytes.Fields(b[i+1:])
	if len(f) < 13 {
		return 0, false
	}
	ut, err1 := strconv.ParseInt(string(f[11]), 10, 64)
	st, err2 := strconv.ParseInt(string(f[12]), 10, 64)
	if err1 != nil || err2 != nil {
		return 0, false
	}
	return time.Duration(ut+st) * time.Second / clockTicks, true
}
