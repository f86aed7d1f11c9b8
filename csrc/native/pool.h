/* A persistent thread pool: the caller is thread 0; workers spin briefly for the next job, then sleep. Barriers
 * spin, then yield the core, so a busy machine slows the engine down instead of collapsing it. */
#ifndef SE_POOL_H
#define SE_POOL_H
typedef struct se_pool se_pool;
typedef void (*se_job)(void *ctx, int ith, int nth);

se_pool *se_pool_new(int nth);
void se_pool_free(se_pool *p);
int se_pool_threads(const se_pool *p);
void se_pool_run(se_pool *p, se_job fn, void *ctx);  /* fn(ctx, i, nth) on every thread; returns when all did */
void se_barrier(se_pool *p);                          /* inside a job: every thread reaches it before any leaves */
#endif
