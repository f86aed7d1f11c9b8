#include "pool.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define CPU_RELAX() _mm_pause()
#elif defined(__aarch64__)
#define CPU_RELAX() __asm__ __volatile__("yield")
#else
#define CPU_RELAX() ((void)0)
#endif

#define SPIN_BEFORE_YIELD 2048   /* waiting for a phase's last items: pause-spins before giving the core away */
#define IDLE_SPIN_NS 300000      /* a worker spins this long for the next phase before sleeping */
#define CLOSED 0xffffffffu        /* a phase's next-item index once the caller is writing the next phase */

struct se_pool {
    int nth;
    pthread_t *threads;
    /* the current phase: high 32 bits its number, low 32 bits the next unclaimed item */
    _Atomic uint64_t state;
    _Atomic(se_items) fn;
    _Atomic(void *) ctx;
    _Atomic int n, chunk, done, stop, sleepers;
    pthread_mutex_t mu;
    pthread_cond_t cv;
};

typedef struct { se_pool *p; int ith; } worker_arg;

static long long now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* Claim and run chunks of the phase `phase` until none is left; returns whether the phase was still current. */
static void work(se_pool *p, uint32_t phase, int ith) {
    for (;;) {
        uint64_t s = atomic_load(&p->state);
        if ((uint32_t)(s >> 32) != phase) return;
        int n = atomic_load(&p->n), chunk = atomic_load(&p->chunk);
        se_items fn = atomic_load(&p->fn);
        void *ctx = atomic_load(&p->ctx);
        if ((uint32_t)s >= (uint32_t)n) return; /* all claimed, or closed */
        int i = (int)(uint32_t)s;
        int end = i + chunk < n ? i + chunk : n;
        /* The claim succeeds only if the phase did not move since `s` was read: then fn, ctx and n are this
         * phase's (the caller writes the next phase's only after every item of this one is done). */
        if (!atomic_compare_exchange_weak(&p->state, &s, (s & 0xffffffff00000000ull) | (uint32_t)end)) continue;
        fn(ctx, ith, i, end);
        atomic_fetch_add(&p->done, end - i);
    }
}

static void *worker(void *arg) {
    se_pool *p = ((worker_arg *)arg)->p;
    int ith = ((worker_arg *)arg)->ith;
    free(arg);
    uint32_t seen = 0;
    for (;;) {
        long long start = now_ns();
        for (int spins = 0; (uint32_t)(atomic_load(&p->state) >> 32) == seen && !atomic_load(&p->stop); spins++) {
            CPU_RELAX();
            if ((spins & 255) == 255 && now_ns() - start > IDLE_SPIN_NS) {
                pthread_mutex_lock(&p->mu);
                atomic_fetch_add(&p->sleepers, 1);
                while ((uint32_t)(atomic_load(&p->state) >> 32) == seen && !atomic_load(&p->stop))
                    pthread_cond_wait(&p->cv, &p->mu);
                atomic_fetch_sub(&p->sleepers, 1);
                pthread_mutex_unlock(&p->mu);
            }
        }
        if (atomic_load(&p->stop)) return NULL;
        seen = (uint32_t)(atomic_load(&p->state) >> 32);
        work(p, seen, ith);
    }
}

se_pool *se_pool_new(int nth) {
    se_pool *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    p->nth = nth < 1 ? 1 : nth;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    p->threads = calloc((size_t)p->nth, sizeof(pthread_t));
    for (int i = 1; i < p->nth; i++) {
        worker_arg *a = malloc(sizeof *a);
        a->p = p;
        a->ith = i;
        if (pthread_create(&p->threads[i], NULL, worker, a) != 0) { /* fewer threads: still correct */
            free(a);
            p->nth = i;
            break;
        }
    }
    return p;
}

int se_pool_threads(const se_pool *p) { return p->nth; }

void se_pool_free(se_pool *p) {
    if (!p) return;
    atomic_store(&p->stop, 1);
    pthread_mutex_lock(&p->mu);
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    for (int i = 1; i < p->nth; i++) pthread_join(p->threads[i], NULL);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv);
    free(p->threads);
    free(p);
}

void se_pool_for(se_pool *p, int n, int chunk, se_items fn, void *ctx) {
    if (n <= 0) return;
    chunk = chunk < 1 ? 1 : chunk;
    if (p->nth == 1 || n <= chunk) { /* one chunk: no one to share it with */
        fn(ctx, 0, 0, n);
        return;
    }
    /* Close the finished phase first: a worker that read its state just before, and then reads the fields written
     * below, would otherwise claim "the rest" of the old phase with the new phase's function (its CAS on the old
     * state still succeeding) and count items the new phase never gave it. */
    uint32_t phase = (uint32_t)(atomic_load(&p->state) >> 32) + 1;
    atomic_store(&p->state, ((uint64_t)(phase - 1) << 32) | CLOSED);
    atomic_store(&p->fn, fn);
    atomic_store(&p->ctx, ctx);
    atomic_store(&p->n, n);
    atomic_store(&p->chunk, chunk);
    atomic_store(&p->done, 0);
    atomic_store(&p->state, (uint64_t)phase << 32);
    if (atomic_load(&p->sleepers) > 0) {
        pthread_mutex_lock(&p->mu);
        pthread_cond_broadcast(&p->cv);
        pthread_mutex_unlock(&p->mu);
    }
    work(p, phase, 0);
    for (int spins = 0; atomic_load(&p->done) < n; spins++) {
        if (spins < SPIN_BEFORE_YIELD) CPU_RELAX();
        else sched_yield();
    }
}
