package main

import (
	"bufio"
	"flag"
	"fmt"
	"os"
	"strings"

	"edgegw/web"
)

// cmdHashPassword reads a password (first line of stdin) and prints the hash
// to put in [http] basic_auth_hash_file.
func cmdHashPassword(args []string) error {
	fs := flag.NewFlagSet("hash-password", flag.ContinueOnError)
	iters := fs.Int("iterations", web.DefaultHashIterations, "PBKDF2-SHA256 iterations")
	if err := fs.Parse(args); err != nil {
		return err
	}
	line, err := bufio.NewReader(os.Stdin).ReadString('\n')
	if err != nil && line == "" {
		return fmt.Errorf("no password on standard input")
	}
	pw := strings.TrimRight(line, "\r\n")
	if pw == "" {
		return fmt.Errorf("empty password")
	}
	h, err := web.HashPassword(pw, *iters)
	if err != nil {
		return err
	}
	fmt.Println(h)
	return nil
}
