# What every registered patcher shares (sourced from /cordon/patchers/common.sh, shipped in the
# digest-pinned prebuild image with them): the bounded child the host prepared, and the
# validator's C compile. Validator code, never the candidate's.

# The bounded child's cgroup, as the host binds it: at /cordon/child/<c> for each v1 controller
# (memory, pids, cpu), or once at /cordon/child/unified on a cgroup v2 host. Its cgroup.procs
# alone is the run account's to write. (Every mount point is a directory of the image: only a
# bound cgroup has a cgroup.procs.)
child_dirs() {
    if [ -e /cordon/child/unified/cgroup.procs ]; then echo unified; else echo memory pids cpu; fi
}

# Refuse to run without the bounded child (exit 125: the host's fault, never the candidate's).
require_child() {
    for c in $(child_dirs); do
        if [ ! -w "/cordon/child/$c/cgroup.procs" ]; then
            echo "$1: the host prepared no bounded child ($c)" >&2
            exit 125
        fi
    done
}

# Move this (sub)shell into the bounded child: everything it runs from now on is held to the
# child's memory, pids and CPU, and killed at the child's deadline by the host.
enter_child() {
    for c in $(child_dirs); do
        echo 0 > "/cordon/child/$c/cgroup.procs" || exit 125
    done
}

# Compile the C sources given as arguments into the shared object $1 with the image's pinned
# compiler and the validator's flags: freestanding (no libc headers, no libc, no start files),
# the compiler's own headers only, its runtime library linked in. Each source is one argument.
compile_c() {
    out="$1"
    shift
    exec /cordon/tcc/tcc -B/cordon/tcc -nostdinc -nostdlib -I/cordon/tcc/include -shared -Wall \
        -o "$out" "$@" /cordon/tcc/libtcc1.a
}
