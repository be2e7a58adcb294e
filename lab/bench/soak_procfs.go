// The soak's /proc readers: descriptors and threads of the gateway.

package bench

import (
	"fmt"
	"os"
	"strings"
)

// procFDs counts a process's open descriptors; procThreads its threads.
func procFDs(pid int) int {
	es, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		return -1
	}
	return len(es)
}

func procThreads(pid int) int {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return -1
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "Threads:"); ok {
			var n int
			_, _ = fmt.Sscan(strings.TrimSpace(v), &n)
			return n
		}
	}
	return -1
}
