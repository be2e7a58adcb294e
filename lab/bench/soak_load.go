// The soak's hostile load: the slow WebSocket client and the request flood.

package bench

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/gorilla/websocket"
)

// slowClient connects to /api/ws with a small receive buffer and never
// reads: the gateway must drop it, not grow a queue for it.
func slowClient(ctx context.Context, page, token string) (*websocket.Conn, error) {
	d := websocket.Dialer{
		HandshakeTimeout: 10 * time.Second,
		ReadBufferSize:   1024,
		NetDialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			c, err := monitorDial(ctx, network, addr)
			if tc, ok := c.(*net.TCPConn); ok {
				_ = tc.SetReadBuffer(4096)
			}
			return c, err
		},
	}
	h := http.Header{}
	h.Set("Authorization", "Bearer "+token)
	c, resp, err := d.DialContext(ctx, "ws"+strings.TrimPrefix(page, "http")+"api/ws", h)
	if resp != nil && resp.Body != nil {
		resp.Body.Close()
	}
	return c, err
}

// flood sends requests from n concurrent clients for d: with a wrong
// Basic password, or with no credentials (plain). It returns the replies
// by status and the number of requests.
func flood(ctx context.Context, page, kind string, n int, d time.Duration) (map[string]uint64, uint64) {
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	tr := &http.Transport{MaxIdleConnsPerHost: n, MaxConnsPerHost: n}
	defer tr.CloseIdleConnections()
	cl := &http.Client{Transport: tr}
	var mu sync.Mutex
	status := map[string]uint64{}
	var total uint64
	var wg sync.WaitGroup
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			mine := map[string]uint64{}
			var count uint64
			for ctx.Err() == nil {
				req, _ := http.NewRequestWithContext(ctx, "GET", page+"api/devices", nil)
				if kind == FloodWrongPassword {
					req.SetBasicAuth("soak", "wrong-password")
				}
				resp, err := cl.Do(req)
				if err != nil {
					if ctx.Err() == nil {
						mine["error"]++
						count++
					}
					continue
				}
				_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
				resp.Body.Close()
				mine[fmt.Sprint(resp.StatusCode)]++
				count++
			}
			mu.Lock()
			for k, v := range mine {
				status[k] += v
			}
			total += count
			mu.Unlock()
		}()
	}
	wg.Wait()
	return status, total
}
