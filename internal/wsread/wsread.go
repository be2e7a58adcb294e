// Package wsread owns one thing: reading a WebSocket message with a bound
// on its size after decompression. gorilla/websocket v1.5.3's SetReadLimit
// counts the bytes of the frames on the wire (conn.go, advanceFrame), so
// with permessage-deflate a small compressed message may inflate to any
// size in ReadMessage; Message stops at max decompressed bytes.
//
// It never writes and keeps no state. Concurrency: the caller's one reader
// goroutine per connection, as gorilla requires.
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
