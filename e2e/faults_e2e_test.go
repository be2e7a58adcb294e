package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"edgegw/internal/testenv"
	"edgegw/lab/sim"
)

// deviceState is the part of /api/devices the fault tests look at.
type deviceState struct {
	Name       string `json:"name"`
	State      string `json:"state"`
	Reason     string `json:"reason"`
	Polls      uint64 `json:"polls"`
	GoodPolls  uint64 `json:"good_polls"`
	Overruns   uint64 `json:"overruns"`
	Demotions  uint64 `json:"demotions"`
	Timeouts   uint64 `json:"timeouts"`
	Late       uint64 `json:"late"`
	Errors     uint64 `json:"errors"`
	Exceptions uint64 `json:"exceptions"`
}

// apiDevices reads /api/devices of gw by name; it fails the test at once
// if gw has exited.
func apiDevices(t *testing.T, gw *proc, page string) map[string]deviceState {
	t.Helper()
	select {
	case <-gw.Done:
		t.Fatalf("the gateway exited (%v)", gw.Cmd.ProcessState)
	default:
	}
	var out struct{ Devices []deviceState }
	if err := getJSON(t, page+"api/devices", &out); err != nil {
		t.Logf("/api/devices: %v", err)
		return nil
	}
	m := map[string]deviceState{}
	for _, d := range out.Devices {
		m[d.Name] = d
	}
	return m
}

// faultConfig is a gateway polling the UDP loggers of fleet at 100 ms, plus extra devices.
func faultConfig(fleet *sim.Fleet, n int, extra string) string {
	var b strings.Builder
	b.WriteString("[gateway]\nid = \"faults\"\n[http]\nlisten = \"127.0.0.1:0\"\n[poll]\nudp_listen = \"127.0.0.1:0\"\n")
	b.WriteString("[[profile]]\nname = \"th\"\ntags = [ { name = \"temperature\", address = 0, type = \"int16\", scale = 0.1 } ]\n")
	for i := 0; i < n; i++ {
		fmt.Fprintf(&b, "[[device]]\nname = \"good-%d\"\ntransport = \"udp\"\naddress = %q\nprofile = \"th\"\ninterval = \"100ms\"\ntimeout = \"50ms\"\n", i, fleet.Addr(i))
	}
	b.WriteString(extra)
	return b.String()
}

func rtuDevice(name, path string) string {
	return fmt.Sprintf("[[device]]\nname = %q\ntransport = \"rtu\"\naddress = %q\nprofile = \"th\"\ninterval = \"200ms\"\ntimeout = \"100ms\"\nserial = { baud = 19200 }\n", name, path)
}

// checkGoodKeptSchedule: every good device polled, never demoted, and
// lost at most one window to a failure of its own (a timeout with no late
// reply, an error, an exception). The windows a loaded machine costs are
// counted by the gateway apart and only logged: overruns (its scheduler
// was late), timeouts whose reply came late, polls answered after their
// window ended.
func checkGoodKeptSchedule(t *testing.T, devs map[string]deviceState, n int) {
	t.Helper()
	for i := 0; i < n; i++ {
		d, ok := devs[fmt.Sprintf("good-%d", i)]
		if !ok {
			t.Errorf("good-%d missing from /api/devices", i)
			continue
		}
		own := d.Errors + d.Exceptions + d.Timeouts - min(d.Timeouts, d.Late)
		if d.Polls < 20 || own > 1 || d.Demotions != 0 {
			t.Errorf("%s: polls %d good %d timeouts %d (late replies %d) errors %d exceptions %d overruns %d demotions %d: %d windows lost to failures",
				d.Name, d.Polls, d.GoodPolls, d.Timeouts, d.Late, d.Errors, d.Exceptions, d.Overruns, d.Demotions, own)
		} else {
			t.Logf("%s: polls %d good %d timeouts %d (late replies %d) overruns %d", d.Name, d.Polls, d.GoodPolls, d.Timeouts, d.Late, d.Overruns)
		}
	}
}

// A reload adding an RTU device at a missing serial port and a UDP device
// at a name that does not resolve: the gateway keeps running, the new
// devices are down with the reason, the old ones keep polling; when the
// port appears (a socat pty linked at that path) the RTU device recovers
// without a restart. (Before: a nil-pointer panic, exit 2, every device stopped.)
func TestFaultReloadAddsUnopenableDevices(t *testing.T) {
	fleet := runFleet(t, sim.Config{Devices: 3, Transport: "udp"})
	dir := t.TempDir()
	port := filepath.Join(dir, "ttyUSB9")
	path := filepath.Join(dir, "edgegw.toml")
	write := func(s string) {
		if err := os.WriteFile(path, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(faultConfig(fleet, 3, ""))
	gw, page := runGateway(t, path)
	waitFor(t, 10*time.Second, "good devices polled", func() bool { return apiDevices(t, gw, page)["good-2"].GoodPolls >= 5 })

	write(faultConfig(fleet, 3, rtuDevice("meter", port)+
		"[[device]]\nname = \"lost\"\ntransport = \"udp\"\naddress = \"logger.nope.invalid:502\"\nprofile = \"th\"\n"))
	_ = gw.Cmd.Process.Signal(syscall.SIGHUP)
	gw.WaitLine("reload: devices applied", 10*time.Second)
	var devs map[string]deviceState
	waitFor(t, 10*time.Second, "meter and lost down with a reason", func() bool {
		devs = apiDevices(t, gw, page)
		return devs["meter"].State == "down" && devs["lost"].State == "down" && devs["meter"].Reason != "" && devs["lost"].Reason != ""
	})
	if r := devs["meter"].Reason; !strings.Contains(r, port) || !strings.Contains(r, "no such file or directory") {
		t.Errorf("meter reason %q", r)
	}
	if r := devs["lost"].Reason; !strings.Contains(r, "logger.nope.invalid") {
		t.Errorf("lost reason %q", r)
	}
	before := apiDevices(t, gw, page)["good-0"].Polls
	waitFor(t, 20*time.Second, "good devices still polled after the reload", func() bool {
		return apiDevices(t, gw, page)["good-0"].Polls >= before+20
	})

	// The adapter is plugged in: the port appears at the configured path.
	a, b := testenv.PTYPair(t)
	bus, err := sim.NewRTUBus(sim.RTUConfig{Path: b, Baud: 19200, Units: []uint8{1}})
	testenv.Running(t, 10*time.Second, "the RTU bus", bus, err)
	if err := os.Symlink(a, port); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 60*time.Second, "meter recovered by itself", func() bool {
		d := apiDevices(t, gw, page)["meter"]
		return d.State == "ok" && d.GoodPolls >= 3
	})
	devs = apiDevices(t, gw, page)
	if d := devs["lost"]; d.State != "down" || d.GoodPolls != 0 {
		t.Errorf("lost: %+v", d)
	}
	checkGoodKeptSchedule(t, devs, 3)
	if code := gw.Stop(os.Interrupt, 15*time.Second); code != 0 {
		t.Errorf("gateway exited %d", code)
	}
}

// One missing serial port among good devices at start-up: the gateway
// starts, polls the good ones and reports the missing one down. `check`
// warns about the port and passes. (Before: exit 1 after 13 ms, 0 polls.)
func TestFaultStartWithMissingPort(t *testing.T) {
	fleet := runFleet(t, sim.Config{Devices: 3, Transport: "udp"})
	dir := t.TempDir()
	port := filepath.Join(dir, "ttyUSB9")
	path := filepath.Join(dir, "edgegw.toml")
	if err := os.WriteFile(path, []byte(faultConfig(fleet, 3, rtuDevice("meter", port))), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(bin, "check", "-config", path).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "warning: serial port "+port+" is missing") {
		t.Fatalf("check: %v\n%s", err, out)
	}
	gw, page := runGateway(t, path)
	var devs map[string]deviceState
	waitFor(t, 20*time.Second, "good devices polled 30 times, meter down", func() bool {
		devs = apiDevices(t, gw, page)
		return devs["good-0"].Polls >= 30 && devs["good-1"].Polls >= 30 && devs["good-2"].Polls >= 30 && devs["meter"].State == "down"
	})
	if r := devs["meter"].Reason; !strings.Contains(r, "no such file or directory") {
		t.Errorf("meter reason %q", r)
	}
	checkGoodKeptSchedule(t, devs, 3)
	if code := gw.Stop(os.Interrupt, 15*time.Second); code != 0 {
		t.Errorf("gateway exited %d", code)
	}
}

// An empty file and a file without devices, given on reload, are refused:
// polling continues. With allow_empty = true the file is applied.
func TestFaultReloadRefusesEmptyConfig(t *testing.T) {
	fleet := runFleet(t, sim.Config{Devices: 2, Transport: "udp"})
	path := filepath.Join(t.TempDir(), "edgegw.toml")
	write := func(s string) {
		if err := os.WriteFile(path, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(faultConfig(fleet, 2, ""))
	gw, page := runGateway(t, path)
	waitFor(t, 10*time.Second, "good devices polled", func() bool { return apiDevices(t, gw, page)["good-1"].GoodPolls >= 5 })
	for _, body := range []string{
		"",
		"[gateway]\nid = \"faults\"\n[http]\nlisten = \"127.0.0.1:0\"\n",
	} {
		write(body)
		_ = gw.Cmd.Process.Signal(syscall.SIGHUP)
		gw.WaitLine("it has no devices and would stop all polling", 10*time.Second)
		n := apiDevices(t, gw, page)["good-0"].Polls
		waitFor(t, 10*time.Second, "polling continues after the refused reload", func() bool {
			d := apiDevices(t, gw, page)
			return len(d) == 2 && d["good-0"].Polls >= n+10
		})
	}
	checkGoodKeptSchedule(t, apiDevices(t, gw, page), 2)

	write("allow_empty = true\n[gateway]\nid = \"faults\"\n[http]\nlisten = \"127.0.0.1:0\"\n")
	_ = gw.Cmd.Process.Signal(syscall.SIGHUP)
	gw.WaitLine("reload: devices applied", 10*time.Second)
	waitFor(t, 10*time.Second, "no devices left", func() bool { d := apiDevices(t, gw, page); return d != nil && len(d) == 0 })
	if code := gw.Stop(os.Interrupt, 15*time.Second); code != 0 {
		t.Errorf("gateway exited %d", code)
	}
}

// `check` fails exactly when `run` refuses to start: a token file that does
// not exist is an error for both, with the key and the path.
func TestFaultCheckAndRunAgreeOnMissingFile(t *testing.T) {
	fleet := runFleet(t, sim.Config{Devices: 1, Transport: "udp"})
	dir := t.TempDir()
	token := filepath.Join(dir, "write.token")
	path := filepath.Join(dir, "edgegw.toml")
	body := strings.Replace(faultConfig(fleet, 1, ""), "[http]\n", fmt.Sprintf("[http]\nwrite_token_file = %q\n", token), 1)
	if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"check", "-config", path}, {"run", "-config", path}} {
		cmd := exec.Command(bin, args...)
		out, _ := cmd.CombinedOutput()
		if cmd.ProcessState.ExitCode() != 1 || !strings.Contains(string(out), "http.write_token_file: open "+token+": no such file or directory") {
			t.Errorf("%s: exit %d\n%s", args[0], cmd.ProcessState.ExitCode(), out)
		}
	}
	if err := os.WriteFile(token, []byte("s3cret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(bin, "check", "-config", path).CombinedOutput(); err != nil {
		t.Fatalf("check with the token file: %v\n%s", err, out)
	}
	gw, page := runGateway(t, path)
	waitFor(t, 10*time.Second, "polled", func() bool { return apiDevices(t, gw, page)["good-0"].GoodPolls >= 3 })
	if code := gw.Stop(os.Interrupt, 15*time.Second); code != 0 {
		t.Errorf("gateway exited %d", code)
	}
}

// `check` prints the buses: units at one address share one, with the
// endpoint's pause; max_connections deals them over several.
func TestCheckPrintsBuses(t *testing.T) {
	path := filepath.Join(t.TempDir(), "edgegw.toml")
	var b strings.Builder
	b.WriteString("[[endpoint]]\naddress = \"127.0.0.1:5020\"\npause = \"20ms\"\n[[endpoint]]\naddress = \"127.0.0.1:5021\"\nmax_connections = 2\n")
	for i, a := range []string{"5020", "5020", "5020", "5021", "5021", "5022"} {
		fmt.Fprintf(&b, "[[device]]\nname = \"u%d\"\ntransport = \"tcp\"\naddress = \"127.0.0.1:%s\"\nunit = %d\ntags = [ { name = \"t\", address = 0 } ]\n", i, a, i+1)
	}
	if err := os.WriteFile(path, []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(bin, "check", "-config", path).CombinedOutput()
	if err != nil {
		t.Fatalf("check: %v\n%s", err, out)
	}
	for _, want := range []string{
		"tcp 127.0.0.1:5020 #0            u0, u1, u2 (pause 20ms)",
		"tcp 127.0.0.1:5021 #0            u3\n",
		"tcp 127.0.0.1:5021 #1            u4\n",
		"tcp 127.0.0.1:5022 #0            u5\n",
	} {
		if !strings.Contains(string(out), want) {
			t.Errorf("check output lacks %q:\n%s", want, out)
		}
	}
}
