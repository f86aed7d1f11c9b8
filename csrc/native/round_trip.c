/* How far apart the cores are: the round trip of one cache line between two threads, spinning, as a phase
 * boundary of the pool pays it (a flag written by one thread and read by the other, and back). On the 2-vCPU VMs
 * here it reads 50-80 ns while the memory roof is about 35 GB/s and 340-400 ns while it is about 60 GB/s: the
 * vCPUs then sit on different dies, each with its own memory path (docs/native.md, "The memory roof").
 * perf/native_kernels.py's Roof reads it with the roof. */
#include <pthread.h>
#include <stdatomic.h>
#include <time.h>

#include "pool.h"

typedef struct {
    _Alignas(64) _Atomic long flag;
    long rounds;
} pingpong;

static void *answer(void *arg) {
    pingpong *pp = arg;
    for (long i = 0; i < pp->rounds; i++) {
        while (atomic_load_explicit(&pp->flag, memory_order_acquire) != 2 * i + 1) SE_RELAX();
        atomic_store_explicit(&pp->flag, 2 * i + 2, memory_order_release);
    }
    return NULL;
}

/* Mean ns of `rounds` round trips between this thread and a new one, after one untimed (the thread's start); -1: no
 * thread could be started. */
double se_round_trip_ns(long rounds) {
    pingpong pp;
    pthread_t t;
    atomic_init(&pp.flag, 0);
    pp.rounds = rounds + 1;
    if (rounds < 1 || pthread_create(&t, NULL, answer, &pp) != 0) return -1.0;
    struct timespec a, b;
    for (long i = 0; i <= rounds; i++) {
        if (i == 1) clock_gettime(CLOCK_MONOTONIC, &a);
        atomic_store_explicit(&pp.flag, 2 * i + 1, memory_order_release);
        while (atomic_load_explicit(&pp.flag, memory_order_acquire) != 2 * i + 2) SE_RELAX();
    }
    clock_gettime(CLOCK_MONOTONIC, &b);
    pthread_join(t, NULL);
    return ((double)(b.tv_sec - a.tv_sec) * 1e9 + (double)(b.tv_nsec - a.tv_nsec)) / (double)rounds;
}
