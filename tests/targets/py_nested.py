# Allocates from three nested Python functions, for the -X perf test
# (tests/integration/python_perf.rs): 2000 bytearrays of 64-88 KiB, each
# from its own malloc, made in leaf() called from middle() from outer();
# one in ten is kept until the end.
#
# Run as a command: allocates, then stays half a second, so that a tracer
# behind its events reads the maps while the trampolines are still mapped
# (Python unmaps them as it exits). With "wait": prints "ready", allocates
# on "go" (stdin), prints "done" and stays until its stdin closes.
import sys
import time


def leaf(i):
    return bytearray(65536 + (i % 7) * 4096)


def middle(i):
    return leaf(i)


def outer(n):
    kept = []
    for i in range(n):
        block = middle(i)
        if i % 10 == 0:
            kept.append(block)
    return kept


if sys.argv[1:] == ["wait"]:
    print("ready", flush=True)
    sys.stdin.readline()
    kept = outer(2000)
    print("done", flush=True)
    sys.stdin.read()
else:
    kept = outer(2000)
    print("kept", len(kept), flush=True)
    time.sleep(0.5)
