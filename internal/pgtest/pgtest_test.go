package pgtest

import "testing"

// A cluster starts, answers SQL, survives an immediate stop and a restart.
func TestStartStopRestart(t *testing.T) {
	s := Start(t)
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
