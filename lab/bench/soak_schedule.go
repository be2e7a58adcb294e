// The soak's scheduling: the config of each reload, the loggers and the
// field events on their schedules.

package bench

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/gorilla/websocket"

	"edgegw/lab/sim"
)

// soakRun is one RunSoak: what every piece needs.
type soakRun struct {
	cfg      SoakConfig
	dir      string
	loggers  []soakLogger // polled from the start to the end
	extras   []soakLogger // added and removed by reloads, in turn
	recvAddr string
	hashFile string
	token    string
	password string
}

const soakGatewayID = "soak"

// config is the gateway's config after reload k (0: the first one).
func (s *soakRun) config(k int) (string, bool) {
	var b strings.Builder
	fmt.Fprintf(&b, "[gateway]\nid = %q\ndata_dir = %q\n", soakGatewayID, filepath.Join(s.dir, "data"))
	fmt.Fprintf(&b, "[http]\nlisten = \"127.0.0.1:0\"\nread_token_file = %q\nbasic_auth_user = \"soak\"\nbasic_auth_hash_file = %q\n",
		filepath.Join(s.dir, "read.token"), s.hashFile)
	b.WriteString("[poll]\nudp_listen = \"127.0.0.1:0\"\n")
	fmt.Fprintf(&b, "[upstream.websocket]\nurl = \"ws://%s/ingest\"\nbatch_wait = \"100ms\"\n", s.recvAddr)
	b.WriteString("[[profile]]\nname = \"th\"\ntags = [ { name = \"temperature\", address = 0, type = \"int16\", scale = 0.1 }, { name = \"humidity\", address = 1, scale = 0.1 } ]\n")
	dev := func(l soakLogger) {
		fmt.Fprintf(&b, "[[device]]\nname = %q\ntransport = %q\naddress = %q\nprofile = \"th\"\ninterval = %q\ntimeout = %q\nretries = %d\n",
			l.name, l.transport, l.addr, s.cfg.Interval.String(), s.cfg.Timeout.String(), s.cfg.Retries)
	}
	for _, l := range s.loggers {
		dev(l)
	}
	dev(s.extras[k%len(s.extras)])
	unopenable := s.cfg.Unopenable && k%2 == 1
	if unopenable {
		if k%4 == 1 {
			fmt.Fprintf(&b, "[[device]]\nname = \"unplugged-%d\"\ntransport = \"rtu\"\naddress = \"/dev/ttyEDGEGWSOAK%d\"\n", k, k)
		} else {
			fmt.Fprintf(&b, "[[device]]\nname = \"unresolvable-%d\"\ntransport = \"udp\"\naddress = \"soak-%d.invalid:502\"\n", k, k)
		}
		fmt.Fprintf(&b, "profile = \"th\"\ninterval = %q\ntimeout = %q\n", s.cfg.Interval.String(), s.cfg.Timeout.String())
	}
	return b.String(), unopenable
}

// writeFile replaces path atomically (a reload never reads half a file).
func writeFile(path, body string) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(body), 0o600); err != nil {
		return fmt.Errorf("bench: soak: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("bench: soak: %w", err)
	}
	return nil
}

// at runs f(k) at start+offset+k·period for k = 0, 1, … while that is
// before end and ctx is not done.
func at(ctx context.Context, start, end time.Time, offset, period time.Duration, f func(k int)) {
	for k := 0; ; k++ {
		when := start.Add(offset + time.Duration(k)*period)
		if !when.Before(end) {
			return
		}
		if sleepCtx(ctx, time.Until(when)) != nil {
			return
		}
		f(k)
	}
}

// startLoggers starts the fleets (their goroutines join wg and run until
// ctx ends) and fills s.loggers and s.extras. Logger i is restarted in turn
// when (i/2)%4 == 0 (a quarter, of both transports when mixed); the rest are
// untouched.
func (s *soakRun) startLoggers(ctx context.Context, wg *sync.WaitGroup) error {
	cfg := s.cfg
	fault := sim.Faults{DropRequest: cfg.Loss, DropResponse: cfg.Loss}
	nUDP, nTCP := cfg.Devices, 0
	if cfg.Transport == "mixed" {
		nTCP = cfg.Devices / 2
		nUDP = cfg.Devices - nTCP
	}
	newFleet := func(n int, tr string, seed int64) (*sim.Fleet, error) {
		if n == 0 {
			return nil, nil
		}
		f, err := sim.NewFleet(sim.Config{Devices: n, Transport: tr, Seed: seed, Faults: fault})
		if err != nil {
			return nil, fmt.Errorf("bench: soak: %w", err)
		}
		wg.Add(1)
		go func() { defer wg.Done(); _ = f.Run(ctx) }()
		return f, nil
	}
	udp, err := newFleet(nUDP, "udp", cfg.Seed)
	if err != nil {
		return err
	}
	tcp, err := newFleet(nTCP, "tcp", cfg.Seed+1)
	if err != nil {
		return err
	}
	extra, err := newFleet(2, "udp", cfg.Seed+2)
	if err != nil {
		return err
	}
	for i := 0; i < cfg.Devices; i++ {
		f, j, tr := udp, i, "udp"
		if tcp != nil && i%2 == 1 {
			f, j, tr = tcp, i/2, "tcp"
		} else if tcp != nil {
			j = i / 2
		}
		s.loggers = append(s.loggers, soakLogger{name: fmt.Sprintf("logger-%02d", i+1), transport: tr, addr: f.Addr(j), l: f.Logger(j), untouched: (i/2)%4 != 0})
	}
	for i := range 2 {
		s.extras = append(s.extras, soakLogger{name: fmt.Sprintf("reloaded-%d", i+1), transport: "udp", addr: extra.Addr(i), l: extra.Logger(i)})
	}
	return nil
}

// soakEvents is what the event goroutines write: counters under mu, and
// the phase the monitor stamps on each sample.
type soakEvents struct {
	mu     sync.Mutex
	ev     SoakEvents
	status map[string]uint64 // flood replies
	phase  atomic.Value      // "", "uplink cut", "flood"
}

func (e *soakEvents) add(f func(e *SoakEvents)) { e.mu.Lock(); f(&e.ev); e.mu.Unlock() }

// startEvents starts one goroutine per kind of event (joining wg), each
// acting on its schedule from start until end or until ctx ends.
func (s *soakRun) startEvents(ctx context.Context, wg *sync.WaitGroup, start, end time.Time, gw *gatewayProc, up *uplink, page, confPath string) *soakEvents {
	cfg := s.cfg
	e := &soakEvents{status: map[string]uint64{}}
	e.phase.Store("")
	run := func(f func()) { wg.Add(1); go func() { defer wg.Done(); f() }() }
	var pool []*sim.Logger
	for _, l := range s.loggers {
		if !l.untouched {
			pool = append(pool, l.l)
		}
	}
	run(func() {
		at(ctx, start, end, cfg.RestartEvery/2, cfg.RestartEvery, func(k int) {
			l := pool[k%len(pool)]
			if err := l.Restart(); err != nil {
				cfg.Logger.Warn("bench: soak: restart logger", "logger", l.Name(), "err", err)
			}
			e.add(func(e *SoakEvents) { e.Restarts++ })
		})
	})
	run(func() {
		at(ctx, start, end, cfg.ReloadEvery/3, cfg.ReloadEvery, func(k int) {
			body, unopenable := s.config(k + 1)
			if err := writeFile(confPath, body); err != nil {
				cfg.Logger.Warn("bench: soak: reload", "err", err)
				return
			}
			_ = gw.cmd.Process.Signal(syscall.SIGHUP)
			cfg.Logger.Info("bench: soak: reload", "n", k+1, "unopenable", unopenable)
			e.add(func(e *SoakEvents) {
				e.Reloads++
				if unopenable {
					e.UnopenableAdds++
				}
			})
		})
	})
	run(func() {
		at(ctx, start, end, cfg.UplinkEvery/3, cfg.UplinkEvery, func(int) {
			if err := up.down(); err != nil {
				cfg.Logger.Warn("bench: soak: receiver", "err", err)
			}
			e.phase.Store("uplink cut")
			e.add(func(e *SoakEvents) { e.UplinkCuts++ })
			cfg.Logger.Info("bench: soak: uplink cut", "for", cfg.UplinkDown)
			_ = sleepCtx(ctx, cfg.UplinkDown)
			if err := up.up(context.Background()); err != nil {
				cfg.Logger.Error("bench: soak: receiver back", "err", err)
			}
			e.phase.Store("")
		})
	})
	run(func() {
		var conn *websocket.Conn
		defer func() {
			if conn != nil {
				conn.Close()
			}
		}()
		at(ctx, start, end, 2*time.Second, cfg.UplinkEvery, func(int) {
			if conn != nil {
				conn.Close()
			}
			var err error
			if conn, err = slowClient(ctx, page, s.token); err != nil {
				cfg.Logger.Warn("bench: soak: slow client", "err", err)
				e.add(func(e *SoakEvents) { e.SlowClientErrors++ })
				return
			}
			e.add(func(e *SoakEvents) { e.SlowClients++ })
		})
	})
	if cfg.Flood != FloodOff {
		run(func() {
			at(ctx, start, end, cfg.FloodEvery*3/4, cfg.FloodEvery, func(int) {
				e.phase.Store("flood")
				cfg.Logger.Info("bench: soak: flood", "kind", cfg.Flood, "clients", cfg.FloodClients, "for", cfg.FloodFor)
				st, n := flood(ctx, page, cfg.Flood, cfg.FloodClients, cfg.FloodFor)
				e.phase.Store("")
				e.add(func(ev *SoakEvents) {
					ev.Floods++
					ev.FloodRequests += n
					for k, v := range st {
						e.status[k] += v
					}
				})
			})
		})
	}
	return e
}
