package wsread

import (
	"fmt"
	"io"

	"github.com/gorilla/websocket"
)

// Message is conn.ReadMessage with the message bounded to max bytes after
// decompression (a bigger one is an error and the connection is to be
// closed).
func Message(conn *websocket.Conn, max int64) (int, []byte, error) {
	typ, r, err := conn.NextReader()
	if err != nil {
		return typ, nil, err
	}
	b, err := io.ReadAll(io.LimitReader(r, max+1))
	if err != nil {
		return typ, nil, err
	}
	if int64(len(b)) > max {
		return typ, nil, fmt.Errorf("wsread: message over %d bytes after decompression", max)
	}
	return typ, b, nil
}
