/* One attempt per invocation, for the ablation suite (bins/stage/tests/root_ablation.rs): `attempt NAME ARGS…`
 * tries exactly one thing a control must stop and prints one line, `NAME=ok` when the attempt
 * succeeded or `NAME=blocked:WHY` when it did not (WHY is the errno, or what was seen). Each
 * attempt is built so that only its control can stop it: its target is one the run account
 * could otherwise use, and it makes only the system calls it names. Static, so it needs no
 * library in the image and runs from any directory. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ipc.h>
#include <sys/mman.h>
#include <sys/shm.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static const char *name = "";

static int ok(void) { printf("%s=ok\n", name); return 0; }
static int blocked(int why) { printf("%s=blocked:%d\n", name, why); return 0; }
static int result(long r) { return r < 0 ? blocked(errno) : ok(); }

static long ms(clockid_t clock) {
    struct timespec t;
    clock_gettime(clock, &t);
    return t.tv_sec * 1000L + t.tv_nsec / 1000000L;
}

/* Run `path arg` in a child; its exit status or, if killed, 1000 + the signal. */
static int run_child(const char *path, const char *arg) {
    pid_t pid = fork();
    if (pid < 0) return 2000 + errno;
    if (pid == 0) {
        execl(path, path, arg, (char *)0);
        _exit(100 + (errno & 0x7f));
    }
    int status = 0;
    waitpid(pid, &status, 0);
    return WIFSIGNALED(status) ? 1000 + WTERMSIG(status) : WEXITSTATUS(status);
}

/* The hexadecimal value of one `Cap…:` line of /proc/self/status, or -1. */
static long long cap_set(const char *field) {
    FILE *f = fopen("/proc/self/status", "r");
    if (!f) return -1;
    char line[256];
    long long v = -1;
    size_t n = strlen(field);
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, field, n) && line[n] == ':') v = strtoll(line + n + 1, 0, 16);
    fclose(f);
    return v;
}

int main(int argc, char **argv) {
    if (argc < 2) return 2;
    name = argv[1];
    const char *a = argc > 2 ? argv[2] : "";
    const char *b = argc > 3 ? argv[3] : "";
    setvbuf(stdout, 0, _IOLBF, 0);

    if (!strcmp(name, "noop")) return 0;
    if (!strcmp(name, "euid")) return geteuid() == 0 ? 0 : 1;
    /* Open an existing file the run account may write, for writing: only a read-only mount
     * refuses (EROFS). Nothing is written. */
    if (!strcmp(name, "write")) return result(open(a, O_WRONLY));
    /* Open a file only its owner (root) may read. */
    if (!strcmp(name, "read")) return result(open(a, O_RDONLY));
    /* Copy this static program into a directory the run account may write and run it. */
    if (!strcmp(name, "exec")) {
        char target[256];
        snprintf(target, sizeof target, "%s/attempt-exec", a);
        int in = open("/proc/self/exe", O_RDONLY), out = open(target, O_WRONLY | O_CREAT | O_TRUNC, 0755);
        if (in < 0 || out < 0) return printf("%s=setup:%d\n", name, errno), 0;
        char buf[65536];
        ssize_t n;
        while ((n = read(in, buf, sizeof buf)) > 0)
            if (write(out, buf, n) != n) return printf("%s=setup:%d\n", name, errno), 0;
        close(in);
        close(out);
        int st = run_child(target, "noop");
        return st == 0 ? ok() : blocked(st >= 100 && st < 1000 ? st - 100 : st);
    }
    /* Read a few bytes of a file every uid may read on the host (masked: /dev/null, 0 bytes). */
    if (!strcmp(name, "masked")) {
        int fd = open(a, O_RDONLY);
        if (fd < 0) return blocked(errno);
        char buf[64];
        ssize_t n = read(fd, buf, sizeof buf);
        return n > 0 ? ok() : blocked(n < 0 ? errno : 0);
    }
    /* List a directory every uid may list on the host (masked: an empty read-only tmpfs). */
    if (!strcmp(name, "masked-dir")) {
        DIR *d = opendir(a);
        if (!d) return blocked(errno);
        int n = 0;
        struct dirent *e;
        while ((e = readdir(d)))
            if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) n++;
        closedir(d);
        return n > 0 ? ok() : blocked(0);
    }
    /* Whether `a` is its own read-only mount point. An observation, not an attempt: every file
     * under the read-only paths is root's and 0644 or stricter, so a non-root uid is refused by
     * its permissions first; the mount is the defence if uid 0 is ever reached. */
    if (!strcmp(name, "ro-mount")) {
        FILE *f = fopen("/proc/self/mountinfo", "r");
        if (!f) return blocked(errno);
        char line[4096];
        int ro = 0;
        while (fgets(line, sizeof line, f)) {
            char point[1024], opts[1024];
            if (sscanf(line, "%*s %*s %*s %*s %1023s %1023s", point, opts) != 2) continue;
            if (strcmp(point, a)) continue;
            /* The last entry for a point is the one on top. */
            ro = 0;
            for (char *o = strtok(opts, ","); o; o = strtok(0, ",")) if (!strcmp(o, "ro")) ro = 1;
        }
        fclose(f);
        return ro ? blocked(0) : ok();
    }
    /* A capability set from the kernel's view of this process: nonzero is "ok". */
    if (!strcmp(name, "cap")) {
        long long v = cap_set(a);
        return v > 0 ? ok() : blocked((int)v);
    }
    /* Give away a file this process owns: CAP_CHOWN in the effective set, nothing else, allows it. */
    if (!strcmp(name, "chown")) {
        char path[256];
        snprintf(path, sizeof path, "%s/attempt-chown", a);
        int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        if (fd < 0) return printf("%s=setup:%d\n", name, errno), 0;
        return result(fchown(fd, 0, 0));
    }
    /* Run the set-user-id-root copy of this program at `a`: only no-new-privileges (or nosuid)
     * keeps the effective uid the caller's. */
    if (!strcmp(name, "setuid")) {
        int st = run_child(a, "euid");
        return st == 0 ? ok() : blocked(st);
    }
    /* A system call no capability gates and the reviewed profile leaves out (keyctl). */
    if (!strcmp(name, "syscall")) return result(syscall(SYS_keyctl, 0L /* GET_KEYRING_ID */, -2L /* process */, 1L));
    /* A call the profile removes from its baseline (pidfd_getfd): take a descriptor from this
     * program's own child, which the run account could otherwise do. */
    if (!strcmp(name, "removed")) {
        int pipefd[2];
        if (pipe(pipefd) < 0) return printf("%s=setup:%d\n", name, errno), 0;
        pid_t pid = fork();
        if (pid == 0) { char c; close(pipefd[1]); read(pipefd[0], &c, 1); _exit(0); }
        close(pipefd[0]);
        long pidfd = syscall(SYS_pidfd_open, (long)pid, 0L);
        if (pidfd < 0) return printf("%s=setup:%d\n", name, errno), 0;
        long r = syscall(SYS_pidfd_getfd, pidfd, 0L, 0L);
        int e = errno;
        close(pipefd[1]);
        waitpid(pid, 0, 0);
        errno = e;
        return result(r);
    }
    /* An address family the allow-list leaves out and no capability gates (netlink route). */
    if (!strcmp(name, "socket")) return result(socket(AF_NETLINK, SOCK_RAW, 0));
    /* A namespace flag on clone that an unprivileged process may otherwise use (a user namespace). */
    if (!strcmp(name, "clone")) {
        long pid = syscall(SYS_clone, (long)(CLONE_NEWUSER | SIGCHLD), 0L, 0L, 0L, 0L);
        if (pid < 0) return blocked(errno);
        if (pid == 0) _exit(0);
        int status = 0;
        waitpid((pid_t)pid, &status, 0);
        return ok();
    }
    /* An i386 system call (getpid through int 0x80) from this x86_64 process. */
    if (!strcmp(name, "arch")) {
        pid_t pid = fork();
        if (pid == 0) {
            long r;
            __asm__ volatile("int $0x80" : "=a"(r) : "a"(20L));
            _exit(r > 0 ? 0 : 1);
        }
        int status = 0;
        waitpid(pid, &status, 0);
        return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? ok() : blocked(WIFSIGNALED(status) ? 1000 + WTERMSIG(status) : WEXITSTATUS(status));
    }
    /* Fork `a` children that wait; every fork must succeed. */
    if (!strcmp(name, "pids")) {
        int want = atoi(a), made = 0, err = 0;
        pid_t kids[4096];
        while (made < want && made < 4096) {
            pid_t p = fork();
            if (p < 0) { err = errno; break; }
            if (p == 0) { pause(); _exit(0); }
            kids[made++] = p;
        }
        for (int i = 0; i < made; i++) kill(kids[i], SIGKILL);
        for (int i = 0; i < made; i++) waitpid(kids[i], 0, 0);
        return made == want ? ok() : blocked(err);
    }
    /* A child touches `a` MiB: it must live to exit 0. */
    /* Reserve `a` MiB of address space, never touched (what a GPU runtime does at start). */
    if (!strcmp(name, "reserve")) {
        size_t n = (size_t)atol(a) << 20;
        void *p = mmap(NULL, n, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        return p == MAP_FAILED ? blocked(errno) : ok();
    }
    if (!strcmp(name, "memory")) {
        pid_t pid = fork();
        if (pid == 0) {
            size_t n = (size_t)atoi(a) << 20;
            char *p = malloc(n);
            if (!p) _exit(3);
            for (size_t i = 0; i < n; i += 4096) p[i] = 1;
            _exit(0);
        }
        int status = 0;
        waitpid(pid, &status, 0);
        return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? ok() : blocked(WIFSIGNALED(status) ? 1000 + WTERMSIG(status) : WEXITSTATUS(status));
    }
    /* Spend `a` ms of CPU: "ok" when that took less than `b` ms of wall time. */
    /* Spin for `a` ms of CPU time and count the quota's signature: stops of one CFS period
     * less the quota (with 0.1 CPU of a 100 ms period, ~90 ms), one per period. Host load
     * alone stops a spinning process at random, for a scheduler slice; it does not stop it
     * for ~90 ms `b` times over. Blocked when at least `b` such stops were seen. */
    if (!strcmp(name, "cpu")) {
        long want = atol(a), needed = atol(b), cpu0 = ms(CLOCK_PROCESS_CPUTIME_ID);
        long last = ms(CLOCK_MONOTONIC), stops = 0;
        while (ms(CLOCK_PROCESS_CPUTIME_ID) - cpu0 < want) {
            long now = ms(CLOCK_MONOTONIC);
            if (now - last >= 60 && now - last <= 130) stops++;
            last = now;
        }
        if (stops < needed) return ok();
        fprintf(stderr, "%ld ms of CPU stopped %ld times for a period\n", want, stops);
        return blocked(0);
    }
    /* Connect to 127.0.0.1:`a`, where the host listens. */
    if (!strcmp(name, "connect")) {
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        if (fd < 0) return printf("%s=setup:%d\n", name, errno), 0;
        struct sockaddr_in sa = {0};
        sa.sin_family = AF_INET;
        sa.sin_port = htons((unsigned short)atoi(a));
        sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        return result(connect(fd, (struct sockaddr *)&sa, sizeof sa));
    }
    /* Find the host's System V shared memory segment `a` (world-readable). */
    if (!strcmp(name, "shm")) {
        struct shmid_ds ds;
        return result(shmctl(atoi(a), IPC_STAT, &ds));
    }
    /* Whether descriptor `a` (one the supervisor holds open on a host file) is open here. */
    if (!strcmp(name, "fd")) {
        struct stat st;
        return result(fstat(atoi(a), &st));
    }
    /* Whether the variable `a` is in this process's environment. */
    if (!strcmp(name, "env")) return getenv(a) ? ok() : blocked(0);
    /* Write `b` bytes into the new file `a`. */
    if (!strcmp(name, "fill")) {
        int fd = open(a, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        if (fd < 0) return printf("%s=setup:%d\n", name, errno), 0;
        static char buf[65536];
        long left = atol(b);
        while (left > 0) {
            ssize_t n = write(fd, buf, left < (long)sizeof buf ? (size_t)left : sizeof buf);
            if (n < 0) return blocked(errno);
            left -= n;
        }
        return fsync(fd) < 0 ? blocked(errno) : ok();
    }
    /* Create `b` empty files in the directory `a`. */
    if (!strcmp(name, "files")) {
        int want = atoi(b);
        for (int i = 0; i < want; i++) {
            char path[512];
            snprintf(path, sizeof path, "%s/f%d", a, i);
            int fd = open(path, O_WRONLY | O_CREAT | O_EXCL, 0600);
            if (fd < 0) return blocked(errno);
            close(fd);
        }
        return ok();
    }
    printf("%s=unknown\n", name);
    return 2;
}
