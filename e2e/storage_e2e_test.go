package e2e

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"edgegw/internal/testenv"
	"edgegw/lab/sim"
)

type storageHealth struct {
	code       int
	Status     string   `json:"status"`
	Reasons    []string `json:"reasons"`
	Recovering bool     `json:"recovering"`
	HoldS      float64  `json:"hold_s"`
}

type storageStatus struct {
	Storage struct {
		DataDir   string `json:"data_dir"`
		State     string `json:"state"`
		FreeBytes int64  `json:"free_bytes"`
		Writers   map[string]struct {
			State       string `json:"state"`
			Error       string `json:"error"`
			LastError   string `json:"last_error"`
			LastErrorUS int64  `json:"last_error_us"`
		} `json:"writers"`
	} `json:"storage"`
}

// data_dir on a full tmpfs and no upstream: the sequence mark cannot be
// written, so /healthz turns 503 with a storage reason (after its hold),
// stays 503 while the disk is full (no flapping: the writer never
// succeeds), and /api/status's storage says which writer fails and why.
// When the filler file is removed, the writers succeed again and /healthz
// goes back to 200; the last error stays in /api/status with its time.
func TestFullDiskHealthzNoUpstream(t *testing.T) {
	needRoot(t)
	fleet := runFleet(t, sim.Config{Devices: 1, Transport: "udp"})
	dir := t.TempDir()
	data := filepath.Join(dir, "data")
	mountTmpfs(t, data, "1m")
	filler := filepath.Join(data, "filler")
	if err := os.WriteFile(filler, make([]byte, 2<<20), 0o600); !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("filling the tmpfs: %v, want no space left on device", err)
	}
	cfg := filepath.Join(dir, "edgegw.toml")
	body := fmt.Sprintf("[gateway]\ndata_dir = %q\n[http]\nlisten = \"127.0.0.1:0\"\n[poll]\nudp_listen = \"127.0.0.1:0\"\n"+
		"[[device]]\nname = \"good\"\ntransport = \"udp\"\naddress = %q\ninterval = \"100ms\"\ntimeout = \"50ms\"\ntags = [ { name = \"t\", address = 0 } ]\n",
		data, fleet.Addr(0))
	if err := os.WriteFile(cfg, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	gw, page := runGateway(t, cfg)
	health := func() (h storageHealth) {
		resp, err := http.Get(page + "healthz")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		h.code = resp.StatusCode
		if h.code == http.StatusTooManyRequests { // the monitor class's rate limit: ask again
			return h
		}
		if err := json.NewDecoder(resp.Body).Decode(&h); err != nil {
			t.Fatalf("healthz %d: %v", h.code, err)
		}
		return h
	}
	status := func() (s storageStatus) {
		if err := getJSON(t, page+"api/status", &s); err != nil {
			t.Fatal(err)
		}
		return s
	}
	var h storageHealth
	testenv.WaitFor(t, 60*time.Second, "/healthz 503 for the full disk", func() bool { h = health(); return h.code == 503 })
	if h.Status != "unhealthy" || len(h.Reasons) == 0 || h.HoldS != 10 {
		t.Fatalf("healthz: %+v", h)
	}
	for _, r := range h.Reasons {
		if !strings.HasPrefix(r, "storage: ") || !strings.Contains(r, "no space left on device") {
			t.Fatalf("a reason that is not the full disk: %+v", h)
		}
	}
	st := status()
	if w := st.Storage.Writers["sequence"]; st.Storage.DataDir != data || st.Storage.State != "failing" ||
		w.State != "failing" || !strings.Contains(w.Error, "no space left on device") || w.LastErrorUS == 0 {
		t.Fatalf("status storage: %+v", st.Storage)
	}
	if _, ok := st.Storage.Writers["queue"]; ok {
		t.Fatalf("a queue writer without an upstream: %+v", st.Storage)
	}
	// While the disk is full the mark's writer never succeeds: 503 at every check.
	n := 0
	testenv.WaitFor(t, 30*time.Second, "5 more answers of /healthz", func() bool {
		switch h := health(); h.code {
		case 503:
			n++
		case http.StatusTooManyRequests:
		default:
			t.Fatalf("healthz back to %d while the disk is full: %+v", h.code, h)
		}
		return n == 5
	})

	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	// The mark is retried with backoff (up to 30 s), the history writes
	// once a minute, then the hold: generous, this asserts no timing.
	testenv.WaitFor(t, 150*time.Second, "/healthz 200 once the disk has space", func() bool { h = health(); return h.code == 200 })
	if h.Status != "ok" || len(h.Reasons) != 0 {
		t.Fatalf("healthz after the disk has space: %+v", h)
	}
	st = status()
	for name, w := range st.Storage.Writers {
		if w.State != "ok" {
			t.Fatalf("writer %s still %s after /healthz recovered: %+v", name, w.State, st.Storage)
		}
	}
	if w := st.Storage.Writers["sequence"]; st.Storage.State != "ok" || st.Storage.FreeBytes <= 0 ||
		!strings.Contains(w.LastError, "no space left on device") || w.LastErrorUS == 0 {
		t.Fatalf("status storage after recovery: %+v", st.Storage)
	}
	if code := gw.Stop(os.Interrupt, 10*time.Second); code != 0 {
		t.Fatalf("exit %d", code)
	}
}
