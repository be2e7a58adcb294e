package pgtest

import (
	"fmt"
	"net"
	"testing"
)

// A cluster starts, answers SQL, survives an immediate stop and a restart,
// and listens on its unix socket only (no TCP port another test's
// connection could take while it is stopped).
func TestStartStopRestart(t *testing.T) {
	s := Start(t)
	if c, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", s.Port)); err == nil {
		c.Close()
		t.Fatalf("the cluster accepts TCP on 127.0.0.1:%d", s.Port)
	}
	if got := s.Psql("SELECT 1+1"); got != "2" {
		t.Fatalf("SELECT 1+1 = %q", got)
	}
	s.Psql("CREATE TABLE k (v int); INSERT INTO k VALUES (7)")
	s.Stop("immediate")
	s.Restart()
	if got := s.Psql("SELECT v FROM k"); got != "7" {
		t.Fatalf("after restart: %q", got)
	}
}
