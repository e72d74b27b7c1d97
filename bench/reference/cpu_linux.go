package reference

import (
	"bytes"
	"os"
	"strconv"
	"time"
)

// clockTicks is USER_HZ, the unit of /proc/<pid>/stat's CPU times: 100 on Linux.
const clockTicks = 100

// ProcessTreeCPU is the CPU time (user + system) process pid and its children have used so
// far (nginx's master and workers, a router run as a child process), read from /proc; false
// when it cannot be known.
func ProcessTreeCPU(pid int) (time.Duration, bool) {
	own, _, ok := procCPU(strconv.Itoa(pid))
	if !ok {
		return 0, false
	}
	total := own
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return 0, false
	}
	for _, e := range ents {
		name := e.Name()
		if name[0] < '1' || name[0] > '9' {
			continue
		}
		if cpu, ppid, ok := procCPU(name); ok && ppid == pid {
			total += cpu
		}
	}
	return total, true
}

// procCPU reads a process's utime + stime and its parent's pid from /proc/<pid>/stat.
func procCPU(pid string) (cpu time.Duration, ppid int, ok bool) {
	b, err := os.ReadFile("/proc/" + pid + "/stat")
	if err != nil {
		return 0, 0, false
	}
	// The command name (field 2) may hold spaces: the fields that follow start after its ')'.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, 0, false
	}
	f := bytes.Fields(b[i+1:]) // f[0] is field 3 (state)
	if len(f) < 13 {
		return 0, 0, false
	}
	pp, err1 := strconv.Atoi(string(f[1]))  // field 4
	ut, err2 := strconv.Atoi(string(f[11])) // field 14
	st, err3 := strconv.Atoi(string(f[12])) // field 15
	if err1 != nil || err2 != nil || err3 != nil {
		return 0, 0, false
	}
	return time.Duration(ut+st) * time.Second / clockTicks, pp, true
}
