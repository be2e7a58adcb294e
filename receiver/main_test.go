package receiver

import (
	"os"
	"path/filepath"
	"testing"

	"go.uber.org/goleak"
)

// TestMain checks for leaked goroutines and removes the binaries the
// end-to-end tests built.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.Cleanup(func(code int) {
		if labBin != "" {
			os.RemoveAll(filepath.Dir(labBin))
		}
		os.Exit(code)
	}))
}
