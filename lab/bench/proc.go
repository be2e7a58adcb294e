package bench

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/pprof"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// ChildEnv is set in a child's environment to its role. A test binary that
// runs the stand checks it in TestMain and calls Main(os.Args[1:], os.Stdout).
const ChildEnv = "EDGEGW_BENCH_CHILD"

// clockTick is USER_HZ: /proc/PID/stat counts CPU time in 1/100 s on Linux.
const clockTick = 10 * time.Millisecond

// Usage is one process's resource use at one moment.
type Usage struct {
	At  time.Time     `json:"at"`
	CPU time.Duration `json:"cpu_ns"` // user + system since the process started
	RSS int64         `json:"rss"`    // VmRSS, bytes
	HWM int64         `json:"hwm"`    // VmHWM (peak RSS), bytes
}

// selfUsage reads this process's CPU time (getrusage, µs resolution) and
// RSS (/proc/self/status).
func selfUsage() Usage {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	u := Usage{At: time.Now(), CPU: time.Duration(ru.Utime.Nano() + ru.Stime.Nano())}
	u.RSS, u.HWM = readStatus("/proc/self/status")
	return u
}

// procUsage reads another process's CPU time (/proc/PID/stat utime+stime,
// 10 ms resolution) and RSS (/proc/PID/status).
func procUsage(pid int) (Usage, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return Usage{}, fmt.Errorf("bench: %w", err)
	}
	// pid (comm) state ppid ... : comm may hold spaces, so split after the last ')'.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return Usage{}, fmt.Errorf("bench: /proc/%d/stat: no ')'", pid)
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 13 {
		return Usage{}, fmt.Errorf("bench: /proc/%d/stat: %d fields", pid, len(f))
	}
	ut, _ := strconv.ParseInt(f[11], 10, 64) // field 14 utime
	st, _ := strconv.ParseInt(f[12], 10, 64) // field 15 stime
	u := Usage{At: time.Now(), CPU: time.Duration(ut+st) * clockTick}
	u.RSS, u.HWM = readStatus(fmt.Sprintf("/proc/%d/status", pid))
	return u, nil
}

func readStatus(path string) (rss, hwm int64) {
	st := readStatusFields(path)
	return st["VmRSS"], st["VmHWM"]
}

// readStatusFields is every "Key: N kB" line of a /proc/PID/status, in bytes.
func readStatusFields(path string) map[string]int64 {
	st := map[string]int64{}
	b, err := os.ReadFile(path)
	if err != nil {
		return st
	}
	for _, line := range strings.Split(string(b), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		f := strings.Fields(v)
		if len(f) < 1 {
			continue
		}
		if n, err := strconv.ParseInt(f[0], 10, 64); err == nil && len(f) == 2 && f[1] == "kB" {
			st[k] = n << 10
		}
	}
	return st
}

// cpuPercent is the CPU used between a and b as % of one core.
func cpuPercent(a, b Usage) float64 {
	wall := b.At.Sub(a.At)
	if wall <= 0 {
		return 0
	}
	return 100 * float64(b.CPU-a.CPU) / float64(wall)
}

func mib(b int64) float64 { return float64(b) / (1 << 20) }

// RaiseFileLimit raises RLIMIT_NOFILE's soft limit to the hard limit (children
// inherit it) and returns the new soft limit.
func RaiseFileLimit() (uint64, error) {
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil {
		return 0, fmt.Errorf("bench: getrlimit: %w", err)
	}
	if rl.Cur < rl.Max {
		rl.Cur = rl.Max
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil {
			return 0, fmt.Errorf("bench: setrlimit nofile %d: %w", rl.Max, err)
		}
	}
	return rl.Cur, nil
}

// child is the gateway under test: this binary re-executed in a role. The
// protocol is lines: the spec as one JSON line on stdin, "ready JSON" on
// stdout, then one command line in ⇒ one reply line out; EOF on stdin stops it.
type child struct {
	cmd   *exec.Cmd
	in    io.WriteCloser
	lines chan string   // stdout lines; closed at EOF
	done  chan struct{} // closed when the process has exited
	err   error         // Wait's result, set before done closes
}

// Exec is how to run this binary as a child: the program and the arguments
// before "child ROLE" (default: os.Executable() and "bench").
type Exec struct {
	Path string
	Args []string
}

// OtherBinary is how to run another edgegw lab binary's children (the
// `-before BIN` of acquire and deliver): `BIN bench child ROLE`. It checks
// that path is an executable file, so a typo fails before any step runs.
func OtherBinary(path string) (Exec, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return Exec{}, fmt.Errorf("bench: -before: %w", err)
	}
	if fi.IsDir() || fi.Mode().Perm()&0o111 == 0 {
		return Exec{}, fmt.Errorf("bench: -before: %s is not an executable file", path)
	}
	return Exec{Path: path, Args: []string{"bench"}}, nil
}

func (e Exec) fill() (Exec, error) {
	if e.Path == "" {
		p, err := os.Executable()
		if err != nil {
			return e, fmt.Errorf("bench: executable: %w", err)
		}
		e.Path, e.Args = p, []string{"bench"}
	}
	return e, nil
}

// startChild starts the child, sends spec and waits for its ready line,
// whose JSON is decoded into ready.
func startChild(ctx context.Context, x Exec, role string, spec, ready any) (*child, error) {
	x, err := x.fill()
	if err != nil {
		return nil, err
	}
	args := append(append([]string{}, x.Args...), "child", role)
	cmd := exec.Command(x.Path, args...)
	cmd.Env = append(os.Environ(), ChildEnv+"="+role)
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, fmt.Errorf("bench: child %s: %w", role, err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, fmt.Errorf("bench: child %s: %w", role, err)
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("bench: child %s: %w", role, err)
	}
	c := &child{cmd: cmd, in: in, lines: make(chan string, 4), done: make(chan struct{})}
	go func() {
		sc := bufio.NewScanner(out)
		sc.Buffer(make([]byte, 64<<10), 64<<20)
		for sc.Scan() {
			c.lines <- sc.Text()
		}
		close(c.lines)
		c.err = cmd.Wait()
		close(c.done)
	}()
	b, _ := json.Marshal(spec)
	if _, err := fmt.Fprintf(in, "%s\n", b); err != nil {
		c.stop()
		return nil, fmt.Errorf("bench: child %s: send spec: %w", role, err)
	}
	line, err := c.next(ctx, 30*time.Second)
	if err != nil {
		c.stop()
		return nil, fmt.Errorf("bench: child %s: %w", role, err)
	}
	js, ok := strings.CutPrefix(line, "ready ")
	if !ok {
		c.stop()
		return nil, fmt.Errorf("bench: child %s: want a ready line, got %q", role, line)
	}
	if ready != nil {
		if err := json.Unmarshal([]byte(js), ready); err != nil {
			c.stop()
			return nil, fmt.Errorf("bench: child %s: ready: %w", role, err)
		}
	}
	return c, nil
}

func (c *child) next(ctx context.Context, timeout time.Duration) (string, error) {
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case line, ok := <-c.lines:
		if !ok {
			<-c.done
			return "", fmt.Errorf("exited: %v", c.err)
		}
		return line, nil
	case <-t.C:
		return "", errors.New("no answer within " + timeout.String())
	case <-ctx.Done():
		return "", ctx.Err()
	}
}

// call sends one command and decodes the JSON reply into v.
func (c *child) call(cmd string, v any) error {
	if _, err := fmt.Fprintf(c.in, "%s\n", cmd); err != nil {
		return fmt.Errorf("bench: child: %s: %w", cmd, err)
	}
	line, err := c.next(context.Background(), 30*time.Second)
	if err != nil {
		return fmt.Errorf("bench: child: %s: %w", cmd, err)
	}
	if err := json.Unmarshal([]byte(line), v); err != nil {
		return fmt.Errorf("bench: child: %s: reply %.80q: %w", cmd, line, err)
	}
	return nil
}

// stop closes stdin (the child exits), waits at most 10 s, then kills it.
func (c *child) stop() {
	_ = c.in.Close()
	t := time.NewTimer(10 * time.Second)
	defer t.Stop()
	for {
		select {
		case _, ok := <-c.lines:
			if ok {
				continue
			}
			<-c.done
			return
		case <-t.C:
			_ = c.cmd.Process.Kill()
			for range c.lines {
			}
			<-c.done
			return
		}
	}
}

// childIO is the child's side of the protocol.
type childIO struct {
	in  *bufio.Scanner
	out io.Writer
}

func newChildIO(in io.Reader, out io.Writer) *childIO {
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 64<<10), 64<<20)
	return &childIO{in: sc, out: out}
}

// spec reads the first line into v.
func (c *childIO) spec(v any) error {
	if !c.in.Scan() {
		return errors.New("bench: child: no spec on stdin")
	}
	return json.Unmarshal(c.in.Bytes(), v)
}

func (c *childIO) reply(prefix string, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(c.out, "%s%s\n", prefix, b)
	return err
}

// serve answers commands with handle until stdin ends or says "stop".
func (c *childIO) serve(handle func(cmd string) any) error {
	for c.in.Scan() {
		cmd := strings.TrimSpace(c.in.Text())
		if cmd == "stop" {
			return nil
		}
		if err := c.reply("", handle(cmd)); err != nil {
			return err
		}
	}
	return c.in.Err()
}

func profilePath(dir, name string) string {
	if dir == "" {
		return ""
	}
	return filepath.Join(dir, name+".pprof")
}

// startProfile writes a CPU profile to path until the returned func is called.
func startProfile(path string) (func(), error) {
	if path == "" {
		return func() {}, nil
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, fmt.Errorf("bench: profile: %w", err)
	}
	f, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("bench: profile: %w", err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, fmt.Errorf("bench: profile: %w", err)
	}
	return func() { pprof.StopCPUProfile(); f.Close() }, nil
}

// machineCPU is the whole machine's busy time (all CPUs, every process),
// from /proc/stat, to show what else competed for the cores.
type machineCPU struct {
	at         time.Time
	busy, idle uint64 // clock ticks
}

func readMachineCPU() machineCPU {
	m := machineCPU{at: time.Now()}
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return m
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	for i := 1; i < len(f); i++ {
		v, _ := strconv.ParseUint(f[i], 10, 64)
		switch i {
		case 4, 5: // idle, iowait
			m.idle += v
		case 9, 10: // guest, guest_nice: already in user
		default:
			m.busy += v
		}
	}
	return m
}

// machinePercent is the machine's busy time between a and b, in % of one core.
func machinePercent(a, b machineCPU) float64 {
	wall := b.at.Sub(a.at)
	if wall <= 0 {
		return 0
	}
	return 100 * float64(time.Duration(b.busy-a.busy)*clockTick) / float64(wall)
}
