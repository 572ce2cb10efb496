/* The kernel's seccomp verdict on a list of system calls, without running any of them — for the
 * differential test of the candidate profile (bins/stage/tests/root_seccomp.rs).
 *
 * `verdict FILE` reads one call per line, `ABI NR A0 A1 A2 A3 A4 A5` (ABI `x64` for the
 * syscall instruction, `i386` for int 0x80; numbers in any base strtoull reads), and prints
 * one line per call, in order: `ABI NR A0 … A5 = ERRNO` with the errno the call returned, or
 * `= killed` when the filter killed the thread that made it (the next call then runs on a new
 * probe thread).
 *
 * How no call runs: the filter under test (A) is already installed — by the runtime inside a
 * container, by the test's seccompiler filter outside one. A probe thread installs a second
 * filter (B) on itself alone that answers every call with SECCOMP_RET_USER_NOTIF, and this
 * process's main thread answers each notification with errno ADMITTED (4000), never letting
 * the call proceed. The kernel runs every filter and takes the most severe action, so a call
 * A refuses (an errno, a kill, a trap) gets A's answer, and a call A admits reaches B and gets
 * 4000. Admitted and refused calls are told apart exactly, and nothing is executed: not
 * `reboot`, not `kill(-1, 9)`, not an x32 or i386 call A should have refused. A thread kill by
 * A is seen by the main thread (the probe thread has ended) and reported; a process kill ends
 * the program (its parent sees SIGSYS). The probe thread makes no other call once B is in
 * place: results go to memory, and the main thread prints them. Static, so it needs no library
 * of the image. */
#define _GNU_SOURCE
#include <errno.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#define ADMITTED 4000
#define MAX_CALLS 8192

struct call {
    int i386, killed;
    unsigned long long nr, a[6];
    long err;
};

static struct call calls[MAX_CALLS];
static int ncalls;
/* The probe thread's notifying filter, or -1 before it is installed, or -2 - errno. */
static atomic_int listener;
/* Whether the probe thread made its last call. */
static atomic_int done;
/* The call the probe thread is making. */
static atomic_int at;

/* One call through int 0x80: the i386 ABI takes six 32-bit arguments in ebx…ebp. */
static long call_i386(struct call *c) {
    long r;
    unsigned int nr = (unsigned int)c->nr;
    unsigned int b = (unsigned int)c->a[0], cx = (unsigned int)c->a[1], d = (unsigned int)c->a[2];
    unsigned int si = (unsigned int)c->a[3], di = (unsigned int)c->a[4];
    __asm__ volatile("int $0x80"
                     : "=a"(r)
                     : "a"(nr), "b"(b), "c"(cx), "d"(d), "S"(si), "D"(di)
                     : "memory");
    /* A 32-bit return value: -4095..-1 is an errno. */
    int r32 = (int)r;
    return r32 < 0 && r32 >= -4095 ? -r32 : 0;
}

static void *probe(void *start) {
    struct sock_filter all[] = {BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_USER_NOTIF)};
    struct sock_fprog prog = {.len = 1, .filter = all};
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) {
        listener = -2 - errno;
        return NULL;
    }
    long fd = syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_NEW_LISTENER, &prog);
    if (fd < 0) {
        listener = -2 - errno;
        return NULL;
    }
    listener = (int)fd;
    /* From here on every call this thread makes is a probe. */
    for (int i = (int)(long)start; i < ncalls; i++) {
        struct call *c = &calls[i];
        at = i;
        if (c->i386) {
            c->err = call_i386(c);
        } else {
            long r = syscall((long)c->nr, c->a[0], c->a[1], c->a[2], c->a[3], c->a[4], c->a[5]);
            c->err = r < 0 ? errno : 0;
        }
    }
    done = 1;
    for (;;) pause(); /* notified and never answered: the thread waits here until exit */
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: verdict FILE\n");
        return 2;
    }
    FILE *f = fopen(argv[1], "r");
    if (!f) {
        perror(argv[1]);
        return 2;
    }
    char abi[8];
    while (ncalls < MAX_CALLS) {
        struct call *c = &calls[ncalls];
        char n[7][32];
        int got = fscanf(f, "%7s %31s %31s %31s %31s %31s %31s %31s", abi, n[0], n[1], n[2], n[3],
                         n[4], n[5], n[6]);
        if (got == EOF) break;
        if (got != 8 || (strcmp(abi, "x64") && strcmp(abi, "i386"))) {
            fprintf(stderr, "verdict: line %d is not ABI NR A0..A5\n", ncalls + 1);
            return 2;
        }
        c->i386 = !strcmp(abi, "i386");
        c->nr = strtoull(n[0], NULL, 0);
        for (int k = 0; k < 6; k++) c->a[k] = strtoull(n[k + 1], NULL, 0);
        ncalls++;
    }
    fclose(f);
    struct seccomp_notif_sizes sizes;
    if (syscall(SYS_seccomp, SECCOMP_GET_NOTIF_SIZES, 0, &sizes) != 0) {
        perror("verdict: SECCOMP_GET_NOTIF_SIZES");
        return 2;
    }
    struct seccomp_notif *req = calloc(1, sizes.seccomp_notif > sizeof(*req) ? sizes.seccomp_notif : sizeof(*req));
    struct seccomp_notif_resp *resp =
        calloc(1, sizes.seccomp_notif_resp > sizeof(*resp) ? sizes.seccomp_notif_resp : sizeof(*resp));
    for (long start = 0; start < ncalls;) {
        listener = -1;
        done = 0;
        pthread_t t;
        if (pthread_create(&t, NULL, probe, (void *)start) != 0) {
            fprintf(stderr, "verdict: no probe thread\n");
            return 2;
        }
        while (listener == -1) sched_yield();
        if (listener < -1) {
            fprintf(stderr, "verdict: cannot install the notifying filter: %s\n", strerror(-2 - listener));
            return 2;
        }
        int ended = 0;
        while (!done && !ended) {
            struct pollfd p = {.fd = listener, .events = POLLIN};
            int ready = poll(&p, 1, 10);
            if (ready > 0 && (p.revents & POLLHUP)) {
                /* No task uses the filter any more: the probe thread has ended. */
                ended = pthread_join(t, NULL) == 0;
                continue;
            }
            if (ready <= 0) {
                ended = pthread_tryjoin_np(t, NULL) == 0;
                continue;
            }
            memset(req, 0, sizes.seccomp_notif);
            if (ioctl(listener, SECCOMP_IOCTL_NOTIF_RECV, req) != 0) continue;
            memset(resp, 0, sizes.seccomp_notif_resp);
            resp->id = req->id;
            resp->error = -ADMITTED;
            ioctl(listener, SECCOMP_IOCTL_NOTIF_SEND, resp);
        }
        if (done) break;
        /* The thread ended in the middle of call `at`: the filter killed it. */
        calls[at].killed = 1;
        close(listener);
        start = at + 1;
    }
    for (int i = 0; i < ncalls; i++) {
        struct call *c = &calls[i];
        printf("%s %llu 0x%llx 0x%llx 0x%llx 0x%llx 0x%llx 0x%llx = ", c->i386 ? "i386" : "x64", c->nr,
               c->a[0], c->a[1], c->a[2], c->a[3], c->a[4], c->a[5]);
        if (c->killed)
            printf("killed\n");
        else
            printf("%ld\n", c->err);
    }
    fflush(stdout);
    _exit(0);
}
