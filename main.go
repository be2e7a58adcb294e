// Command edgegw is the gateway: see README.md. main.go only wires packages.
package main

import (
	"fmt"
	"os"
	"runtime"
)

// Stamped by the Makefile (-X main.version=… etc.).
var (
	version = "dev"
	commit  = "unknown"
	date    = "unknown"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "version" {
		fmt.Printf("edgegw %s (commit %s, built %s, %s %s/%s)\n", version, commit, date, runtime.Version(), runtime.GOOS, runtime.GOARCH)
		return
	}
	fmt.Fprintln(os.Stderr, "usage: edgegw run|demo|check|sim|receive|bench|version")
	os.Exit(2)
}
