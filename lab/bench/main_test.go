package bench

import (
	"os"
	"testing"

	"go.uber.org/goleak"
)

// TestMain doubles as the stand's child: RunAcquire and RunDeliver
// re-execute this test binary with ChildEnv set (see testExec).
func TestMain(m *testing.M) {
	if os.Getenv(ChildEnv) != "" {
		if err := Main(os.Args[1:], os.Stdout); err != nil {
			os.Stderr.WriteString(err.Error() + "\n")
			os.Exit(1)
		}
		os.Exit(0)
	}
	goleak.VerifyTestMain(m)
}

// testExec runs children as this test binary: `TESTBINARY child ROLE`.
func testExec(t *testing.T) Exec {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	return Exec{Path: exe, Args: []string{}}
}
