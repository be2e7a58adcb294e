//go:build nolab && !pprof

package main

import (
	"context"
	"errors"
	"log/slog"
	"net"
)

// The shipped build (-tags nolab) leaves the -pprof listener out: runtime/pprof
// and its gzip writer are ~220 KB of a binary whose pages are most of a small
// gateway's RSS. Build with -tags nolab,pprof (bench acquire -full -pprof
// does) to profile the shipped build.
func profileListener(string) (net.Listener, error) {
	return nil, errors.New("-pprof: not in this build (the gateway build leaves it out; add the build tag pprof)")
}

func serveProfiles(context.Context, net.Listener, *slog.Logger) error { return nil }
