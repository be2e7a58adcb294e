package wsread

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"edgegw/internal/testenv"

	"github.com/gorilla/websocket"
)

// A deflated message that inflates past max is refused, though its frames
// are far below SetReadLimit (gorilla counts the compressed bytes); one at
// max passes.
func TestMessageBoundsDecompressed(t *testing.T) {
	const max = 64 << 10
	got := make(chan error, 2)
	sizes := make(chan int, 2)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		up := websocket.Upgrader{EnableCompression: true}
		c, err := up.Upgrade(w, r, nil)
		if err != nil {
			got <- err
			return
		}
		defer c.Close()
		c.SetReadLimit(max)
		for range 2 {
			_, b, err := Message(c, max)
			sizes <- len(b)
			got <- err
			if err != nil {
				return
			}
		}
	}))
	defer srv.Close()
	d := websocket.Dialer{EnableCompression: true, HandshakeTimeout: 5 * time.Second}
	c, resp, err := d.Dial("ws"+strings.TrimPrefix(srv.URL, "http"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if !strings.Contains(resp.Header.Get("Sec-WebSocket-Extensions"), "permessage-deflate") {
		t.Fatal("deflate not negotiated")
	}
	if err := c.WriteMessage(websocket.TextMessage, bytes.Repeat([]byte("a"), max)); err != nil {
		t.Fatal(err)
	}
	if n, err := testenv.Recv(t, sizes, 10*time.Second, "size"), testenv.Recv(t, got, 10*time.Second, "result"); err != nil || n != max {
		t.Fatalf("message of max bytes: %d, %v", n, err)
	}
	// ~6.5 MB, some 30 kB deflated: the server stops reading at max+1 and
	// closes, so this write may see the reset.
	_ = c.WriteMessage(websocket.TextMessage, bytes.Repeat([]byte("a"), 100*max))
	testenv.Recv(t, sizes, 10*time.Second, "size")
	if err := testenv.Recv(t, got, 10*time.Second, "result"); err == nil || !strings.Contains(err.Error(), "after decompression") {
		t.Fatalf("bomb: %v", err)
	}
}
