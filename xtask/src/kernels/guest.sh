#!/bin/bash
# Runs inside each guest kernel (virtme-ng over the host's root, read-only).
# It only runs the checks and keeps their raw results: per check, under
# OUT/CHECK, the tracer's exit status, stderr, stdout, the JSON report and
# the seconds it took. `cargo xtask kernels` judges them on the host.
#
# Usage: guest.sh OUT TRACER BIN_DIR CHECK_TIMEOUT
set -u
out=$1 tracer=$2 bin=$3 limit=$4
uname -r >"$out/uname"
scratch=$(mktemp -d)

# launch CHECK [TRACER ARGS...] -- CMD...: the tracer starts CMD itself; CMD
# reads "go" on stdin (the sites protocol) and exits when done.
launch() {
    local d=$out/$1
    shift
    mkdir -p "$d"
    local start=$SECONDS
    echo go | timeout -s INT -k 10 "$limit" "$tracer" --verbose -f json \
        -o "$d/report.json" "$@" >"$d/stdout" 2>"$d/stderr"
    echo $? >"$d/exit"
    echo $((SECONDS - start)) >"$d/seconds"
}

# wait_for FILE TEXT PID: until FILE holds TEXT, while PID lives.
wait_for() {
    local deadline=$((SECONDS + limit))
    until grep -q "$2" "$1" 2>/dev/null; do
        kill -0 "$3" 2>/dev/null || return 1
        [ $SECONDS -lt $deadline ] || return 1
        sleep 0.2
    done
}

# A running program (waiting on a fifo) traced by --pid, then allocating;
# it lives until the tracer has stopped, so its frames can still be named.
attach() {
    local d=$out/pid-attach
    mkdir -p "$d"
    local start=$SECONDS
    mkfifo "$scratch/in"
    "$bin/sites" <"$scratch/in" >"$d/target.out" &
    local target=$!
    exec 3>"$scratch/in"
    wait_for "$d/target.out" ready $target
    "$tracer" --verbose --pid $target --sample-rate 1 -f json \
        -o "$d/report.json" >"$d/stdout" 2>"$d/stderr" &
    local tracer_pid=$!
    if wait_for "$d/stderr" "memtrace-bpf: tracing " $tracer_pid; then
        echo go >&3
        wait_for "$d/target.out" done $target
    fi
    kill -INT $tracer_pid 2>/dev/null
    wait $tracer_pid
    echo $? >"$d/exit"
    exec 3>&-
    kill $target 2>/dev/null
    wait $target 2>/dev/null
    echo $((SECONDS - start)) >"$d/seconds"
}

launch exact-3-sites --sample-rate 1 -- "$bin/sites" exit
attach
launch sampling -- "$bin/sites" exit
launch rust-jemalloc --sample-rate 1 -- "$bin/rjem" exit
echo finished >"$out/finished"
