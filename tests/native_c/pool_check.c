/* The thread pool's hand-out under stress (tests/test_native_pool.py builds it with ThreadSanitizer): thousands of
 * phases of every size and piece length on 2-4 threads, with a worker that is sometimes slow (the stealing path).
 * Every item must run exactly once per phase, on some thread, before se_pool_for returns. */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "pool.h"

typedef struct {
    _Atomic int *hits;
    int phase;
    int slow_thread;
} job;

static void items(void *p, int thread, int a, int b) {
    job *j = p;
    if (thread == j->slow_thread && (j->phase & 7) == 0) {
        struct timespec ts = {0, 20000}; /* 20 us: the other threads steal this one's share */
        nanosleep(&ts, NULL);
    }
    for (int i = a; i < b; i++) atomic_fetch_add(&j->hits[i], 1);
}

int main(void) {
    int bad = 0, phases = 0;
    for (int nth = 1; nth <= 4; nth++) {
        se_pool *p = se_pool_new(nth);
        if (!p) return 2;
        for (int phase = 0; phase < 3000; phase++, phases++) {
            int n = 1 + (phase * 7919) % 997, chunk = 1 + (phase * 104729) % 37;
            _Atomic int *hits = calloc((size_t)n, sizeof *hits);
            job j = {hits, phase, phase % nth};
            se_pool_for(p, n, chunk, items, &j);
            for (int i = 0; i < n; i++)
                if (atomic_load(&hits[i]) != 1) {
                    if (bad++ < 10) printf("threads %d phase %d item %d of %d ran %d times\n", nth, phase, i, n,
                                           atomic_load(&hits[i]));
                }
            free(hits);
        }
        se_pool_free(p);
    }
    printf("%d phases, %d bad items\n", phases, bad);
    return bad != 0;
}
