#include "pool.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>


#define SPIN_BEFORE_YIELD 2048   /* waiting for a phase's last items: pause-spins before giving the core away */
#define IDLE_SPIN_NS 300000      /* a worker spins this long for the next phase before sleeping */

/* A thread's share of a phase: pieces [lo, hi), tagged with the phase so a claim made against a finished phase's
 * share fails. One word: the owner takes pieces from the front, a thief from the back, both by CAS. */
#define TAG_BITS 24
#define POS_BITS 20
#define MAX_PIECES ((1u << POS_BITS) - 1)
#define TAG(v) ((uint32_t)((v) >> (2 * POS_BITS)))
#define LO(v) ((uint32_t)((v) >> POS_BITS) & MAX_PIECES)
#define HI(v) ((uint32_t)(v) & MAX_PIECES)
typedef struct {
    _Alignas(64) _Atomic uint64_t v; /* each on its own line: an owner's claims never contend with another's */
} share;

struct se_pool {
    int nth;
    pthread_t *threads;
    share *shares;
    /* the current phase's number (its low TAG_BITS tag the shares) */
    _Atomic uint32_t phase;
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

static uint64_t pack(uint32_t tag, uint32_t lo, uint32_t hi) {
    return (uint64_t)(tag & ((1u << TAG_BITS) - 1)) << (2 * POS_BITS) | (uint64_t)lo << POS_BITS | hi;
}

/* Take one piece of thread t's share for phase `tag`: the front one (its owner) or the back one (a thief).
 * Returns the piece, or -1 once the share is empty or belongs to another phase. */
static int claim(se_pool *p, int t, uint32_t tag, int own) {
    uint64_t v = atomic_load(&p->shares[t].v);
    for (;;) {
        if (TAG(v) != (tag & ((1u << TAG_BITS) - 1)) || LO(v) >= HI(v)) return -1;
        uint64_t next = own ? pack(tag, LO(v) + 1, HI(v)) : pack(tag, LO(v), HI(v) - 1);
        if (atomic_compare_exchange_weak(&p->shares[t].v, &v, next)) return own ? (int)LO(v) : (int)HI(v) - 1;
    }
}

/* Run the pieces of phase `phase` this thread can get: its own share front to back (one sequential stream, which
 * the prefetchers follow), then other threads' from their backs. A claim tagged with a finished phase fails (the
 * caller rewrites the shares only after every piece of a phase is done). fn, ctx, n and chunk are read after the
 * first claim succeeds: the phase it came from is then the current one, and cannot end before this thread adds
 * what it did, so they are that phase's even if the 24-bit tag had wrapped around while this thread slept. */
static void work(se_pool *p, uint32_t phase, int ith) {
    if (atomic_load(&p->phase) != phase) return;
    int n = 0, chunk = 0;
    se_items fn = 0;
    void *ctx = 0;
    int did = 0; /* counted once at the end: one write to the shared counter per thread and phase */
    for (int k = 0; k < p->nth; k++) {
        int t = (ith + k) % p->nth;
        for (int piece; (piece = claim(p, t, phase, k == 0)) >= 0;) {
            if (!fn) {
                n = atomic_load(&p->n);
                chunk = atomic_load(&p->chunk);
                fn = atomic_load(&p->fn);
                ctx = atomic_load(&p->ctx);
            }
            int a = piece * chunk, b = a + chunk < n ? a + chunk : n;
            fn(ctx, ith, a, b);
            did += b - a;
        }
    }
    if (did) atomic_fetch_add(&p->done, did);
}

static void *worker(void *arg) {
    se_pool *p = ((worker_arg *)arg)->p;
    int ith = ((worker_arg *)arg)->ith;
    free(arg);
    uint32_t seen = 0;
    for (;;) {
        long long start = now_ns();
        for (int spins = 0; atomic_load(&p->phase) == seen && !atomic_load(&p->stop); spins++) {
            SE_RELAX();
            if ((spins & 255) == 255 && now_ns() - start > IDLE_SPIN_NS) {
                pthread_mutex_lock(&p->mu);
                atomic_fetch_add(&p->sleepers, 1);
                while (atomic_load(&p->phase) == seen && !atomic_load(&p->stop))
                    pthread_cond_wait(&p->cv, &p->mu);
                atomic_fetch_sub(&p->sleepers, 1);
                pthread_mutex_unlock(&p->mu);
            }
        }
        if (atomic_load(&p->stop)) return NULL;
        seen = atomic_load(&p->phase);
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
    p->shares = aligned_alloc(64, (size_t)p->nth * sizeof(share));
    if (!p->threads || !p->shares) {
        free(p->threads);
        free(p->shares);
        free(p);
        return NULL;
    }
    for (int i = 0; i < p->nth; i++) atomic_init(&p->shares[i].v, 0);
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
    free(p->shares);
    free(p);
}

void se_pool_for(se_pool *p, int n, int chunk, se_items fn, void *ctx) {
    if (n <= 0) return;
    chunk = chunk < 1 ? 1 : chunk;
    if (p->nth == 1 || n <= chunk) { /* one chunk: no one to share it with */
        fn(ctx, 0, 0, n);
        return;
    }
    int pieces = (n + chunk - 1) / chunk;
    while ((unsigned)pieces > MAX_PIECES) {
        chunk *= 2;
        pieces = (n + chunk - 1) / chunk;
    }
    /* Every piece of the last phase is done (the wait below), so no claim can succeed on the shares rewritten
     * here; the fields are published before the phase number that workers read first. */
    uint32_t phase = atomic_load(&p->phase) + 1;
    atomic_store(&p->fn, fn);
    atomic_store(&p->ctx, ctx);
    atomic_store(&p->n, n);
    atomic_store(&p->chunk, chunk);
    atomic_store(&p->done, 0);
    for (int t = 0; t < p->nth; t++) /* contiguous shares: each thread streams one run of the phase's items */
        atomic_store(&p->shares[t].v, pack(phase, (uint32_t)((long long)pieces * t / p->nth),
                                           (uint32_t)((long long)pieces * (t + 1) / p->nth)));
    atomic_store(&p->phase, phase);
    if (atomic_load(&p->sleepers) > 0) {
        pthread_mutex_lock(&p->mu);
        pthread_cond_broadcast(&p->cv);
        pthread_mutex_unlock(&p->mu);
    }
    work(p, phase, 0);
    for (int spins = 0; atomic_load(&p->done) < n; spins++) {
        if (spins < SPIN_BEFORE_YIELD) SE_RELAX();
        else sched_yield();
    }
}
