// Package wsread owns one thing: reading a WebSocket message with a bound
// on its size after decompression. gorilla/websocket v1.5.3's SetReadLimit
// counts the bytes of the frames on the wire (conn.go, advanceFrame), so
// with permessage-deflate a small compressed message may inflate to any
// size in ReadMessage; Message stops at max decompressed bytes.
//
// It never writes and keeps no state. Concurrency: the caller's one reader
// goroutine per connection, as gorilla requires.
package wsread
