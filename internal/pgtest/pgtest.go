// Package pgtest starts a real PostgreSQL server (Debian's postgresql-15)
// for one test: initdb into a temporary directory as the postgres system
// user (initdb refuses root), pg_ctl listening on a unix socket in that
// directory only, stopped in t.Cleanup.
//
// No TCP port: a test that stops the server and starts it again (a database
// outage) would have to get its port back, and while it is down any other
// test's connection may take that number as its local port (seen under a
// loaded make test: "could not bind IPv4 address "127.0.0.1": Address already
// in use"). The socket's path is the test's own.
//
// It is imported by _test.go files only and never by a binary. Under CI
// (CI set, not false) a missing PostgreSQL fails the test; elsewhere it
// skips.
//
// Concurrency: a Server's methods are called from the test's goroutine;
// URL may be read from any.
package pgtest

import (
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// BinDir holds Debian's PostgreSQL 15 server programs.
var BinDir = "/usr/lib/postgresql/15/bin"

// Server is one PostgreSQL cluster of a test.
type Server struct {
	Port    int    // the number in the socket's name (.s.PGSQL.PORT): no TCP port is listened on
	Dir     string // the cluster's data directory
	sockDir string
	logFile string
	runAs   []string // the command prefix that runs a program as the cluster's owner ("" when not root)
	t       testing.TB
}

// URL is the connection URL of the database postgres as user postgres
// over the cluster's unix socket (trust authentication), as libpq and pgx
// read it: the socket's directory in host, its number in port.
func (s *Server) URL() string {
	return fmt.Sprintf("postgres://postgres@/postgres?host=%s&port=%d&sslmode=disable", url.QueryEscape(s.sockDir), s.Port)
}

// Start initialises a cluster and starts it; it is stopped (immediate mode)
// when the test ends.
func Start(t testing.TB) *Server {
	t.Helper()
	initdb := filepath.Join(BinDir, "initdb")
	if _, err := os.Stat(initdb); err != nil {
		need(t, initdb)
	}
	base, err := os.MkdirTemp("", "pgtest-")
	if err != nil {
		t.Fatal(err)
	}
	s := &Server{Dir: filepath.Join(base, "data"), sockDir: base, logFile: filepath.Join(base, "postgres.log"), t: t}
	t.Cleanup(func() { os.RemoveAll(base) })
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			u, err = user.Lookup("nobody")
		}
		if err != nil {
			t.Fatalf("pgtest: running as root and no postgres or nobody user to own the cluster: %v", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		if err := os.Chown(base, uid, gid); err != nil {
			t.Fatal(err)
		}
		setpriv, err := exec.LookPath("setpriv")
		if err != nil {
			need(t, "setpriv")
		}
		s.runAs = []string{setpriv, "--reuid=" + u.Uid, "--regid=" + u.Gid, "--clear-groups", "--"}
	}
	if out, err := s.cmd(initdb, "-D", s.Dir, "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync", "--locale=C").CombinedOutput(); err != nil {
		t.Fatalf("pgtest: initdb: %v\n%s", err, out)
	}
	var last error
	for attempt := 0; attempt < 5; attempt++ {
		s.Port = freePort(t)
		if last = s.startErr(); last == nil {
			t.Cleanup(func() { s.stop("immediate") })
			return s
		}
		t.Logf("pgtest: port %d: %v; retrying", s.Port, last)
	}
	t.Fatalf("pgtest: postgres did not start: %v\n%s", last, s.Log())
	return nil
}

// need fails (under CI) or skips the test: tool is missing.
func need(t testing.TB, tool string) {
	t.Helper()
	if ci := os.Getenv("CI"); ci != "" && ci != "false" {
		t.Fatalf("pgtest: %s missing (CI must install postgresql)", tool)
	}
	t.Skipf("pgtest: %s missing (apt-get install postgresql)", tool)
}

// freePort is a number for the socket's name, free as a TCP port too so that
// two clusters of one test never share a name.
func freePort(t testing.TB) int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

func (s *Server) cmd(prog string, args ...string) *exec.Cmd {
	argv := append(append(append([]string(nil), s.runAs...), prog), args...)
	c := exec.Command(argv[0], argv[1:]...)
	c.Dir = s.sockDir
	c.Env = append(os.Environ(), "LC_ALL=C")
	return c
}

// startErr runs pg_ctl start -w (it waits until the server accepts).
// fsync is off (a test survives a server crash, not a machine's) but
// synchronous_commit stays on: a commit is in the WAL before it returns, so
// that pg_ctl stop -m immediate loses nothing that was committed.
func (s *Server) startErr() error {
	opts := fmt.Sprintf("-c listen_addresses='' -p %d -k %s -c fsync=off -c full_page_writes=off -c max_connections=200", s.Port, s.sockDir)
	out, err := s.cmd(filepath.Join(BinDir, "pg_ctl"), "start", "-w", "-t", "60", "-D", s.Dir, "-l", s.logFile, "-o", opts).CombinedOutput()
	if err != nil {
		return fmt.Errorf("pg_ctl start: %v: %s", err, strings.TrimSpace(string(out)))
	}
	return nil
}

// Stop stops the server with pg_ctl stop -m mode (smart, fast, immediate).
func (s *Server) Stop(mode string) {
	s.t.Helper()
	if err := s.stop(mode); err != nil {
		s.t.Fatal(err)
	}
}

func (s *Server) stop(mode string) error {
	if _, err := os.Stat(filepath.Join(s.Dir, "postmaster.pid")); err != nil {
		return nil // not running
	}
	out, err := s.cmd(filepath.Join(BinDir, "pg_ctl"), "stop", "-w", "-t", "60", "-D", s.Dir, "-m", mode).CombinedOutput()
	if err != nil {
		return fmt.Errorf("pgtest: pg_ctl stop -m %s: %v: %s", mode, err, out)
	}
	return nil
}

// Restart starts a stopped server again on the same socket.
func (s *Server) Restart() {
	s.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		err := s.startErr()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("pgtest: restart: %v\n%s", err, s.Log())
		}
		time.Sleep(200 * time.Millisecond) // a retry interval: the old postmaster may still be going after an immediate stop
	}
}

// Psql runs psql with the SQL and returns its unaligned, tuples-only output.
func (s *Server) Psql(sql string) string {
	s.t.Helper()
	psql, err := exec.LookPath("psql")
	if err != nil {
		need(s.t, "psql")
	}
	out, err := exec.Command(psql, "-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-d", s.URL(), "-c", sql).CombinedOutput()
	if err != nil {
		s.t.Fatalf("pgtest: psql %q: %v\n%s", sql, err, out)
	}
	return strings.TrimSpace(string(out))
}

// Log returns the server's log so far.
func (s *Server) Log() string {
	b, _ := os.ReadFile(s.logFile)
	return string(b)
}
