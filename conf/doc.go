// Package conf owns the configuration file: its TOML parser (toml.go, TOML
// 1.1, which records the line of every key as it parses), its schema, the defaults
// (all in defaults.go), profile merging, and validation whose messages name
// the file, line, device and tag. Load/Parse return a fully resolved Config or
// every problem found (Errors), never just the first.
//
// It never opens devices, sockets or token files, never starts goroutines and
// imports no project package but tagtype, whose table of tag types it
// validates tags with (a Tag keeps the type's name; internal/gateway parses
// it into tagtype's values). It never builds the other packages' Configs:
// internal/gateway maps a Config onto each of them (and decides what run
// refuses or warns about beyond this validation). Token and certificate
// files are named here and read by their users.
//
// Concurrency: Load and Parse are pure functions of their input and safe to
// call concurrently. A returned *Config is a plain value with no locks; treat
// it as read-only once shared.
package conf
