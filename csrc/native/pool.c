#include "pool.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
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

#define SPIN_BEFORE_YIELD 4096   /* barrier: pause-spins before giving the core away */
#define IDLE_SPIN_NS 200000      /* worker: spin this long for the next job before sleeping */

struct se_pool {
    int nth;
    pthread_t *threads;
    _Atomic int job_seq, done, stop, sleepers;
    _Atomic int bar_count, bar_gen;
    se_job fn;
    void *ctx;
    pthread_mutex_t mu;
    pthread_cond_t cv;
};

typedef struct { se_pool *p; int ith; } worker_arg;

static long long now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

void se_barrier(se_pool *p) {
    if (p->nth == 1) return;
    int gen = atomic_load(&p->bar_gen);
    if (atomic_fetch_add(&p->bar_count, 1) == p->nth - 1) {
        atomic_store(&p->bar_count, 0);
        atomic_fetch_add(&p->bar_gen, 1);
        return;
    }
    for (int spins = 0; atomic_load(&p->bar_gen) == gen; spins++) {
        if (spins < SPIN_BEFORE_YIELD) CPU_RELAX();
        else sched_yield();
    }
}

static void *worker(void *arg) {
    se_pool *p = ((worker_arg *)arg)->p;
    int ith = ((worker_arg *)arg)->ith, seen = 0;
    free(arg);
    for (;;) {
        long long start = now_ns();
        for (int spins = 0; atomic_load(&p->job_seq) == seen && !atomic_load(&p->stop); spins++) {
            CPU_RELAX();
            if ((spins & 255) == 255 && now_ns() - start > IDLE_SPIN_NS) {
                pthread_mutex_lock(&p->mu);
                atomic_fetch_add(&p->sleepers, 1);
                while (atomic_load(&p->job_seq) == seen && !atomic_load(&p->stop)) pthread_cond_wait(&p->cv, &p->mu);
                atomic_fetch_sub(&p->sleepers, 1);
                pthread_mutex_unlock(&p->mu);
            }
        }
        if (atomic_load(&p->stop)) return NULL;
        seen = atomic_load(&p->job_seq);
        p->fn(p->ctx, ith, p->nth);
        atomic_fetch_add(&p->done, 1);
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

void se_pool_run(se_pool *p, se_job fn, void *ctx) {
    if (p->nth == 1) {
        fn(ctx, 0, 1);
        return;
    }
    p->fn = fn;
    p->ctx = ctx;
    atomic_store(&p->done, 0);
    atomic_fetch_add(&p->job_seq, 1);
    if (atomic_load(&p->sleepers) > 0) {
        pthread_mutex_lock(&p->mu);
        pthread_cond_broadcast(&p->cv);
        pthread_mutex_unlock(&p->mu);
    }
    fn(ctx, 0, p->nth);
    for (int spins = 0; atomic_load(&p->done) < p->nth - 1; spins++) {
        if (spins < SPIN_BEFORE_YIELD) CPU_RELAX();
        else sched_yield();
    }
}
