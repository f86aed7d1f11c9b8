/* A persistent thread pool that hands out work, not threads: the caller publishes a phase of n items and claims
 * pieces of them like every worker; the phase ends when all items are done, not when every thread has arrived.
 * Each thread owns a contiguous share of the pieces and takes them front to back, so a matmul's weights reach it
 * as one sequential stream (the hardware and software prefetchers stay ahead; PERF_FACTS.md); a thread that runs
 * out steals pieces from the back of another's share. A worker the OS has descheduled therefore holds up at most
 * the piece it is inside, never a whole barrier: on a busy machine the engine slows towards one thread's speed
 * instead of collapsing (llama.cpp's spinning barriers do). Idle workers spin briefly for the next phase, then
 * sleep. */
#ifndef SE_POOL_H
#define SE_POOL_H
/* one pause in a spin on a flag another thread writes (pool.c's waits, round_trip.c) */
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define SE_RELAX() _mm_pause()
#elif defined(__aarch64__)
#define SE_RELAX() __asm__ __volatile__("yield")
#else
#define SE_RELAX() ((void)0)
#endif
typedef struct se_pool se_pool;
typedef void (*se_items)(void *ctx, int thread, int begin, int end);  /* process items [begin, end) */

se_pool *se_pool_new(int nth);
void se_pool_free(se_pool *p);
int se_pool_threads(const se_pool *p);
/* Run fn over items [0, n) in pieces of `chunk`, on every thread; returns when all are done. Items must be
 * independent: which thread computes an item never changes its result. */
void se_pool_for(se_pool *p, int n, int chunk, se_items fn, void *ctx);
#endif
