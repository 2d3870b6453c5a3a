/* The threads a kernel call splits its tasks over (included once, by rkkernels.c).
 *
 * Our own small pool rather than OpenMP: an OpenMP region ends in a barrier every thread must reach,
 * so on a busy machine one descheduled sibling stalls every call (2 threads ran 3x slower than 1).
 * Here the caller publishes a job and works on it at once; helpers claim tasks from a shared counter
 * as they arrive, and the caller waits only for tasks a helper has claimed, never for a helper that
 * has not turned up. A claimed task can still keep it waiting (a stall: its helper was preempted).
 * When stalls cost over a tenth of the time, or helpers seldom get a core to run on, the caller runs
 * alone for a while, longer each time that repeats (on a machine busy with other work 2 threads then
 * run about like 1, where OpenMP's ran 3x slower).
 *
 * Which thread runs a task never changes its result: a task is a fixed range of output rows.
 * Helpers spin a little between jobs (decode calls come microseconds apart), then sleep on a
 * condition variable. Calls made while the pool is busy (other Python threads) run on their caller.
 */
#ifndef RKPOOL_H
#define RKPOOL_H

#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <time.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define cpu_relax() _mm_pause()
#elif defined(__aarch64__)
#define cpu_relax() __asm__ __volatile__("yield")
#else
#define cpu_relax() ((void)0)
#endif

#define POOL_MAX_HELPERS 63
#define POOL_MAX_TASKS 0xffff  /* the task counter's width in the ticket */
#define POOL_SPIN_NS 300000    /* a helper idles this long before it sleeps */
#define POOL_STALL_NS 200000   /* waiting this much longer than our own share took: a helper was preempted */
#define POOL_SOLO_MIN_NS 20000000LL   /* first solo period; doubles while its reason recurs... */
#define POOL_SOLO_MAX_NS 2000000000LL /* ...up to this */

typedef void (*pool_task_fn)(const void *ctx, int64_t task);

static struct {
    pthread_mutex_t busy;     /* held by the caller whose job is published */
    pthread_mutex_t sleep_mx; /* helpers sleep on `wake` under this */
    pthread_cond_t wake;
    /* job generation (bits 32-63) | task count (16-31) | next task to claim (0-15) */
    _Atomic uint64_t ticket;
    _Atomic int64_t done;     /* tasks of the current job finished by helpers */
    _Atomic int sleepers;
    _Atomic int helpers_wanted; /* helpers with a lower index may join the current job */
    pool_task_fn fn;          /* the job: written before its ticket is published */
    const void *ctx;
    int helpers;              /* helper threads started */
    int64_t solo_until, solo_ns; /* after frequent stalls: run alone until then (monotonic ns) */
    int64_t last_stall;
    double helper_share;      /* moving average of the helpers' share of a job's tasks */
    int64_t stats[6];         /* jobs shared, jobs alone in a solo period, stalls, ns stalled, tasks of
                                 shared jobs, those run by helpers */
} pool = {.busy = PTHREAD_MUTEX_INITIALIZER, .sleep_mx = PTHREAD_MUTEX_INITIALIZER, .wake = PTHREAD_COND_INITIALIZER,
          .helper_share = 1.0};

static int64_t pool_now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

/* Claim and run tasks of job generation `gen` until none is left; returns how many ran. */
static int64_t pool_work(uint32_t gen)
{
    int64_t ran = 0;
    uint64_t t = atomic_load_explicit(&pool.ticket, memory_order_acquire);
    for (;;) {
        const uint32_t next = (uint32_t)(t & 0xffff), ntask = (uint32_t)((t >> 16) & 0xffff);
        if ((uint32_t)(t >> 32) != gen || next >= ntask) return ran;
        if (!atomic_compare_exchange_weak_explicit(&pool.ticket, &t, t + 1, memory_order_acquire,
                                                   memory_order_acquire))
            continue;
        /* the job cannot change while one of its tasks is claimed and unfinished */
        pool.fn(pool.ctx, next);
        ran++;
        t = atomic_load_explicit(&pool.ticket, memory_order_acquire);
    }
}

static void *pool_helper(void *arg)
{
    const int index = (int)(intptr_t)arg;
    uint32_t seen = (uint32_t)(atomic_load(&pool.ticket) >> 32);
    for (;;) {
        uint32_t gen = seen;
        int64_t idle_since = pool_now();
        for (unsigned spin = 1; gen == seen; spin++) {
            cpu_relax();
            gen = (uint32_t)(atomic_load_explicit(&pool.ticket, memory_order_acquire) >> 32);
            if (gen != seen || spin % 256) continue;
            if (pool_now() - idle_since < POOL_SPIN_NS) {
                if (spin % 4096 == 0) sched_yield(); /* let a thread sharing this core run */
                continue;
            }
            pthread_mutex_lock(&pool.sleep_mx);
            atomic_fetch_add(&pool.sleepers, 1);
            while ((gen = (uint32_t)(atomic_load(&pool.ticket) >> 32)) == seen)
                pthread_cond_wait(&pool.wake, &pool.sleep_mx);
            atomic_fetch_sub(&pool.sleepers, 1);
            pthread_mutex_unlock(&pool.sleep_mx);
        }
        seen = gen;
        if (index >= atomic_load_explicit(&pool.helpers_wanted, memory_order_relaxed)) continue;
        const int64_t ran = pool_work(gen);
        if (ran) atomic_fetch_add_explicit(&pool.done, ran, memory_order_release);
    }
    return NULL;
}

static void pool_after_fork(void)
{
    /* the child has none of the helper threads; the caller alone runs every job */
    pthread_mutex_init(&pool.busy, NULL);
    pthread_mutex_init(&pool.sleep_mx, NULL);
    pthread_cond_init(&pool.wake, NULL);
    pool.helpers = 0;
    atomic_store(&pool.sleepers, 0);
}

static void pool_start_helpers(int n)
{
    static int atfork_done;
    if (!atfork_done) atfork_done = !pthread_atfork(NULL, NULL, pool_after_fork);
    if (n > POOL_MAX_HELPERS) n = POOL_MAX_HELPERS;
    sigset_t all, old; /* signals stay with the application's threads */
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    while (pool.helpers < n) {
        pthread_t th;
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        const int rc = pthread_create(&th, &attr, pool_helper, (void *)(intptr_t)pool.helpers);
        pthread_attr_destroy(&attr);
        if (rc) break; /* fewer helpers: the caller does more of the work */
        pool.helpers++;
    }
    pthread_sigmask(SIG_SETMASK, &old, NULL);
}

/* Run jobs alone for a while: 20 ms, doubling (to 2 s) while the reason recurs within a second of
 * the last solo period. Helpers go to sleep meanwhile. Called with `busy` held. */
static void pool_go_solo(int64_t now)
{
    const int recent = pool.solo_ns && now - pool.solo_until < 1000000000LL;
    pool.solo_ns = recent ? 2 * pool.solo_ns : POOL_SOLO_MIN_NS;
    if (pool.solo_ns > POOL_SOLO_MAX_NS) pool.solo_ns = POOL_SOLO_MAX_NS;
    pool.solo_until = now + pool.solo_ns;
    pool.helper_share = 1.0; /* a fresh start when the period ends */
}

/* Run fn(ctx, task) for task in [0, ntask) on up to `threads` threads (the caller included). */
static void pool_run(pool_task_fn fn, const void *ctx, int64_t ntask, int threads)
{
    if (threads > 1 && ntask > 1 && ntask <= POOL_MAX_TASKS && pthread_mutex_trylock(&pool.busy) == 0) {
        const int64_t t0 = pool_now();
        if (t0 >= pool.solo_until) {
            pool_start_helpers(threads - 1);
            pool.fn = fn;
            pool.ctx = ctx;
            atomic_store_explicit(&pool.done, 0, memory_order_relaxed);
            atomic_store_explicit(&pool.helpers_wanted, threads - 1, memory_order_relaxed);
            const uint32_t gen = (uint32_t)(atomic_load(&pool.ticket) >> 32) + 1;
            atomic_store(&pool.ticket, (uint64_t)gen << 32 | (uint64_t)ntask << 16);
            if (atomic_load(&pool.sleepers)) {
                pthread_mutex_lock(&pool.sleep_mx);
                pthread_cond_broadcast(&pool.wake);
                pthread_mutex_unlock(&pool.sleep_mx);
            }
            const int64_t mine = pool_work(gen);
            /* wait for the tasks helpers claimed: at most about one task's time, unless a helper was
             * preempted (or runs on a much slower core) */
            const int64_t t1 = pool_now();
            int64_t now = t1;
            const int64_t stall_after = POOL_STALL_NS + (t1 - t0); /* we waited longer than we worked */
            for (unsigned spin = 1; atomic_load_explicit(&pool.done, memory_order_acquire) < ntask - mine; spin++) {
                cpu_relax();
                /* stalled: maybe that helper shares our core (yielding any earlier would risk losing
                 * our core for a scheduler slice) */
                if (spin % 256 == 0 && (now = pool_now()) - t1 > stall_after) sched_yield();
            }
            pool.stats[0]++;
            pool.stats[4] += ntask;
            pool.stats[5] += ntask - mine;
            /* helpers that seldom get a core (a machine busy with other work) only take CPU time
             * from it, and from us: when their share of the tasks stays under a fifth of a fair one,
             * run alone for a while */
            const double fair = (double)(threads - 1) / threads;
            pool.helper_share += ((double)(ntask - mine) / ntask - pool.helper_share) / 64;
            if (pool.helper_share < fair / 5) pool_go_solo(now);
            if (mine && now - t1 > stall_after) {
                pool.stats[2]++;
                pool.stats[3] += now - t1;
                /* frequent stalls (over a tenth of the time since the last one): run alone for a while,
                 * longer if that solo period ended less than a second ago */
                if (pool.last_stall && 10 * (now - t1) > now - pool.last_stall) pool_go_solo(now);
                pool.last_stall = now;
            }
            pthread_mutex_unlock(&pool.busy);
            return;
        }
        pool.stats[1]++;
        pthread_mutex_unlock(&pool.busy);
    }
    for (int64_t task = 0; task < ntask; task++) fn(ctx, task);
}

#endif /* RKPOOL_H */
