/* A persistent thread pool that hands out work, not threads: the caller publishes a phase of n items and claims
 * chunks of them like every worker; the phase ends when all items are done, not when every thread has arrived.
 * A worker the OS has descheduled therefore holds up at most the chunk it is inside, never a whole barrier: on a
 * busy machine the engine slows towards one thread's speed instead of collapsing (llama.cpp's spinning barriers
 * do, PERF_FACTS.md). Idle workers spin briefly for the next phase, then sleep. */
#ifndef SE_POOL_H
#define SE_POOL_H
typedef struct se_pool se_pool;
typedef void (*se_items)(void *ctx, int thread, int begin, int end);  /* process items [begin, end) */

se_pool *se_pool_new(int nth);
void se_pool_free(se_pool *p);
int se_pool_threads(const se_pool *p);
/* Run fn over items [0, n) in chunks of `chunk`, on every thread; returns when all are done. Items must be
 * independent: which thread computes an item never changes its result. */
void se_pool_for(se_pool *p, int n, int chunk, se_items fn, void *ctx);
#endif
