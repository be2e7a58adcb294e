#!/usr/bin/env python3
"""gotestjson.py: go test -json on stdin, go test's plain output on stdout.

    go test -json ... | build/gotestjson.py TIMES

Prints what a plain `go test` prints: each package's ok/FAIL line, build
errors, and the whole output of every test that failed (a test's output is
held until it ends and dropped when it passed or was skipped). A test that
never ended (a panic, the -timeout) has its output printed when its package
ends. Appends one line per top-level test to TIMES: seconds, package, test,
result; make test prints the slowest from it. The exit status is go test's
to give: this filter exits 0 unless its input is not go test -json.
"""
import json
import sys

HIDE = ("=== RUN", "=== PAUSE", "=== CONT", "=== NAME")


def main():
    times = open(sys.argv[1], "a") if len(sys.argv) > 1 else None
    held = {}  # (package, test) -> output lines
    out = sys.stdout
    for line in sys.stdin:
        try:
            ev = json.loads(line)
        except ValueError:
            out.write(line)  # not an event (go vet or the go command itself)
            out.flush()
            continue
        action, pkg, test = ev.get("Action"), ev.get("Package", ""), ev.get("Test")
        text = ev.get("Output", "")
        if action == "build-output":
            out.write(text)
        elif test is None:
            # The package's own lines: ok/FAIL, a panic outside a test. The
            # package's end first prints what its unended tests said.
            if text.startswith(("ok", "FAIL")) or action in ("pass", "fail", "skip"):
                for (p, name), lines in list(held.items()):
                    if p == pkg:
                        out.write("".join(lines))  # never ended: a panic or the timeout
                        del held[(p, name)]
            if action == "output" and text.strip() != "PASS":
                out.write(text)
        elif action == "output":
            if not text.startswith(HIDE):
                held.setdefault((pkg, test), []).append(text)
        elif action in ("pass", "fail", "skip"):
            lines = held.pop((pkg, test), [])
            if action == "fail":
                out.write("".join(lines))
            if times and "/" not in test:
                times.write("%.2f\t%s\t%s\t%s\n" % (ev.get("Elapsed", 0), pkg, test, action))
        out.flush()
    if times:
        times.close()


if __name__ == "__main__":
    main()
