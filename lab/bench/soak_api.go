// The soak's API client: the monitor's reads of the gateway's HTTP API.

package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// soakAPI reads the gateway's API with the read token.
type soakAPI struct {
	base, token string
	client      *http.Client
}

// monitorAddr is the source address of the bench's own requests and the
// slow client (the flood comes from 127.0.0.1): the gateway limits each
// client address, and the monitor is not the attacker.
var monitorAddr = net.IPv4(127, 0, 0, 3)

func monitorDial(ctx context.Context, network, addr string) (net.Conn, error) {
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: monitorAddr}}
	return d.DialContext(ctx, network, addr)
}

// get reads path into v (a *string takes the body as is). A 429 is waited
// out (Retry-After, at most 2 s) up to 5 times.
func (a *soakAPI) get(ctx context.Context, path string, v any) error {
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	var resp *http.Response
	for try := 0; ; try++ {
		req, err := http.NewRequestWithContext(ctx, "GET", a.base+path, nil)
		if err != nil {
			return err
		}
		req.Header.Set("Authorization", "Bearer "+a.token)
		if resp, err = a.client.Do(req); err != nil {
			return err
		}
		if resp.StatusCode != http.StatusTooManyRequests || try == 5 {
			break
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		wait := time.Second
		if n, err := strconv.Atoi(resp.Header.Get("Retry-After")); err == nil {
			wait = min(max(time.Duration(n)*time.Second, 100*time.Millisecond), 2*time.Second)
		}
		if err := sleepCtx(ctx, wait); err != nil {
			return err
		}
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		_, _ = io.Copy(io.Discard, resp.Body)
		return fmt.Errorf("%s: %s", path, resp.Status)
	}
	if s, ok := v.(*string); ok {
		b, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
		*s = string(b)
		return err
	}
	return json.NewDecoder(resp.Body).Decode(v)
}

type soakStatus struct {
	Seq      uint64 `json:"seq"`
	Upstream struct {
		Path         string `json:"path"`
		QueueSamples int64  `json:"queue_samples"`
		Dropped      uint64 `json:"dropped"`
	} `json:"upstream"`
	Clients struct {
		WSDropped uint64 `json:"ws_dropped"`
	} `json:"clients"`
}

type soakDevice struct {
	Name      string `json:"name"`
	State     string `json:"state"`
	Polls     uint64 `json:"polls"`
	GoodPolls uint64 `json:"good_polls"`
	Overruns  uint64 `json:"overruns"`
	Demotions uint64 `json:"demotions"`
}

func (a *soakAPI) devices(ctx context.Context) (map[string]soakDevice, error) {
	var out struct {
		Devices []soakDevice `json:"devices"`
	}
	if err := a.get(ctx, "api/devices", &out); err != nil {
		return nil, err
	}
	m := make(map[string]soakDevice, len(out.Devices))
	for _, d := range out.Devices {
		m[d.Name] = d
	}
	return m, nil
}

// goroutines reads go_goroutines from /metrics; -1 when it is not there.
func (a *soakAPI) goroutines(ctx context.Context) int {
	var body string
	if err := a.get(ctx, "metrics", &body); err != nil {
		return -1
	}
	for _, line := range strings.Split(body, "\n") {
		if v, ok := strings.CutPrefix(line, "go_goroutines "); ok {
			var n float64
			if _, err := fmt.Sscan(v, &n); err == nil {
				return int(n)
			}
		}
	}
	return -1
}
