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

# A check that outlived its limit (timeout's 124, or 137 when killed) was
# stuck in the kernel (a verification that runs to the verifier's limit
# takes minutes under TCG): the checks after it would be too, so they are
# marked skipped (status 125) to keep the guest's time bounded.
stuck=
skipped() {
    [ -n "$stuck" ] || return 1
    echo "skipped: $stuck timed out in this guest" >"$1/stderr"
    echo 125 >"$1/exit"
}
note_timeout() {
    case $(cat "$2/exit") in 124 | 137) stuck=${stuck:-$1} ;; esac
}

# launch CHECK [TRACER ARGS...] -- CMD...: the tracer starts CMD itself; CMD
# reads "go" on stdin (the sites protocol) and exits when done.
launch() {
    local name=$1 d=$out/$1
    shift
    mkdir -p "$d"
    skipped "$d" && return
    local start=$SECONDS
    echo go | timeout -s INT -k 10 "$limit" "$tracer" --verbose -f json \
        -o "$d/report.json" "$@" >"$d/stdout" 2>"$d/stderr"
    echo $? >"$d/exit"
    echo $((SECONDS - start)) >"$d/seconds"
    note_timeout "$name" "$d"
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
    skipped "$d" && return
    local start=$SECONDS
    mkfifo "$scratch/in"
    "$bin/sites" <"$scratch/in" >"$d/target.out" &
    local target=$!
    exec 3>"$scratch/in"
    wait_for "$d/target.out" ready $target
    "$tracer" --verbose --pid $target --sample-rate 1 -f json \
        -o "$d/report.json" >"$d/stdout" 2>"$d/stderr" &
    local tracer_pid=$!
    local timed_out=
    if wait_for "$d/stderr" "memtrace-bpf: tracing " $tracer_pid; then
        echo go >&3
        wait_for "$d/target.out" done $target
    elif kill -0 $tracer_pid 2>/dev/null; then
        timed_out=1
    fi
    kill -INT $tracer_pid 2>/dev/null
    # A signal reaches a tracer inside bpf_prog_load only when that
    # verification ends: one that never started tracing is killed if it
    # does not stop soon. One that traced writes its report, which takes
    # a while under TCG on a busy host: it gets the check's limit.
    local grace=$limit
    [ -n "$timed_out" ] && grace=10
    (sleep "$grace" && kill -KILL $tracer_pid 2>/dev/null) &
    local killer=$!
    wait $tracer_pid
    local status=$?
    kill $killer 2>/dev/null
    if [ -n "$timed_out" ]; then status=124; fi
    echo $status >"$d/exit"
    exec 3>&-
    kill $target 2>/dev/null
    wait $target 2>/dev/null
    echo $((SECONDS - start)) >"$d/seconds"
    note_timeout pid-attach "$d"
}

# The agent's standby tracer: it loads its programs with the settings in
# a map, says "ready", then runs the command line it reads on stdin; "go"
# after that line is left for the command.
ahead() {
    local name=loaded-ahead d=$out/loaded-ahead
    mkdir -p "$d"
    skipped "$d" && return
    local start=$SECONDS
    {
        printf '["memtrace-bpf","--verbose","--sample-rate","1","-f","json","-o","%s","--","%s","exit"]\n' \
            "$d/report.json" "$bin/sites"
        echo go
    } | timeout -s INT -k 10 "$limit" "$tracer" agent-ahead >"$d/stdout" 2>"$d/stderr"
    echo $? >"$d/exit"
    echo $((SECONDS - start)) >"$d/seconds"
    note_timeout "$name" "$d"
}

# --cgroup on a cgroup v2 with the memory controller (this host's is on
# v1): a cgroup2 hierarchy is mounted in the guest, a program that grows
# through mmap runs in a cgroup of it, and the report must read the
# cgroup's memory from its own files.
cgroup_v2() {
    local d=$out/cgroup-v2-memory
    mkdir -p "$d"
    skipped "$d" && return
    local start=$SECONDS
    local root
    root=$(awk '$3 == "cgroup2" { print $2; exit }' /proc/mounts)
    if [ -z "$root" ]; then
        root=/sys/fs/cgroup
        mount -t cgroup2 none "$root" 2>"$d/stderr" || { echo 1 >"$d/exit"; return; }
    fi
    echo +memory >"$root/cgroup.subtree_control" 2>>"$d/stderr"
    mkdir -p "$root/memtrace-traced"
    "$bin/rss_growth" mmap 120 >"$d/target.out" &
    local target=$!
    echo $target >"$root/memtrace-traced/cgroup.procs"
    timeout -s INT -k 10 "$limit" "$tracer" --verbose --cgroup "$root/memtrace-traced" \
        -d 3 -f json -o "$d/report.json" >"$d/stdout" 2>>"$d/stderr"
    echo $? >"$d/exit"
    kill $target 2>/dev/null
    wait $target 2>/dev/null
    echo $((SECONDS - start)) >"$d/seconds"
    note_timeout cgroup-v2-memory "$d"
}

launch exact-3-sites --sample-rate 1 -- "$bin/sites" exit
attach
launch sampling -- "$bin/sites" exit
launch rust-jemalloc --sample-rate 1 -- "$bin/rjem" exit
ahead
cgroup_v2
echo finished >"$out/finished"
