/* SPDX-License-Identifier: Apache-2.0 */
#ifndef KVX_LCORE_H
#define KVX_LCORE_H
/**
 * @file
 * kvx_lcore: the runtime core of kvxfer (docs/architecture.md §1, docs/runtime-notes.md §1, §2, §4).
 *
 * - **Options** (docs/runtime-notes.md §1.1): DPDK EAL-style core selection, `-l/--lcores` (lists and
 *   the `lcores@cpus` mapping grammar), `-c` hex mask (compat alias), `--main-lcore`,
 *   `--control-lcore`, `--idle busy|adaptive`. Parsing (grammar only, any machine) and
 *   validation (against the CPUs of this host / this process) are separate steps.
 * - **Lcore threads** (§1.2, §1.3, §2): one pinned pthread per lcore, launch/wait/stop.
 * - **Poll loop**: pollers return KVX_POLL_BUSY / KVX_POLL_IDLE; the loop accounts busy vs idle
 *   time, announces a QSBR quiescent state once per iteration and applies the idle policy.
 * - **Idle policies** and the reusable **waiter** (eventfd + "sleeping" flag) (§1.7).
 * - **Rings** (§1.4): bounded, power-of-two, pointers or fixed-size elements, SP/MP, SC/MC.
 * - **RCU** (§4.2): QSBR thread helpers and a read-mostly hash table over `cds_lfht`.
 * - **Timers**: a binary-heap timer facility for the control lcore.
 *
 * Threading model. Objects are created and destroyed by one setup thread (the engine's, or
 * the main thread of kvxfer-perf), never concurrently with their use. Each lcore thread owns
 * its pollers and its poll loop. Rings are the only objects shared on the hot path; their
 * thread-safety is spelled out by each function's `_sp/_mp/_sc/_mc` qualifier. Everything in
 * this header returns 0/count or a negative errno (include/kvxfer/common.h).
 *
 * Sub-prefixes: `kvx_lcore_` (options, threads, poll loop), `kvx_poller_` (this header),
 * `kvx_waiter_` (kvxfer/waiter.h), `kvx_ring_` (kvxfer/ring.h), `kvx_rcu_` (QSBR helpers,
 * `kvx_rcu_table_`; kvxfer/rcu.h), `kvx_timer_` (kvxfer/timer.h). This header includes the
 * other four, so including it alone gives the whole runtime core.
 */
#include <sched.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "kvxfer/common.h"
#include "kvxfer/rcu.h"
#include "kvxfer/ring.h"
#include "kvxfer/timer.h"
#include "kvxfer/waiter.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ============================================================================================
 * Constants
 * ========================================================================================== */

/** Largest lcore id and CPU number accepted by the option grammar (ids are 0..1023). */
#define KVX_LCORE_ID_MAX 1023u
/** Most lcores one configuration may enable (polling lcores; the control lcore is extra). */
#define KVX_LCORE_MAX 128u
/** "No lcore" / "pick one for me" / "not an lcore thread". */
#define KVX_LCORE_ID_ANY UINT32_MAX
/** Most pollers registered on one lcore. */
#define KVX_LCORE_MAX_POLLERS 32u
/** Recommended error buffer size for the option functions, bytes. */
#define KVX_LCORE_ERRLEN 256u

/** Idle policy of a polling lcore (`--idle`). */
enum kvx_lcore_idle {
	/** `adaptive`: spin KVX_LCORE_SPIN_POLLS empty polls with a pause hint, then back off
	 *  (sched_yield per empty poll, KVX_LCORE_BACKOFF_POLLS times), then go QSBR-offline and
	 *  sleep on the lcore's waiter eventfd until a ring producer, kvx_lcore_wake(), a timer
	 *  deadline or max_sleep_ns wakes it. The default: a machine with fewer CPUs than
	 *  threads still makes progress, and an idle runtime uses < 5 % of a core. */
	KVX_LCORE_IDLE_ADAPTIVE = 0,
	/** `busy`: spin with a pause hint forever (lowest latency, one full core per lcore). */
	KVX_LCORE_IDLE_BUSY = 1,
};

/** Default number of consecutive empty polls spun before backing off (DPDK emptypoll_max). */
#define KVX_LCORE_SPIN_POLLS 512u
/** Default number of empty polls with sched_yield() between spinning and sleeping. */
#define KVX_LCORE_BACKOFF_POLLS 64u
/** Default longest sleep of an adaptive lcore without any wake, ns (100 ms). */
#define KVX_LCORE_MAX_SLEEP_NS 100000000ull
/** kvx_lcore_idle_params.max_sleep_ns: no cap. The sleep ends only on a wake (a ring producer,
 *  kvx_lcore_wake(), kvx_lcore_stop()), a readable wait fd or the attached heap's next timer
 *  deadline: an lcore with nothing due makes no periodic wake-up at all. */
#define KVX_LCORE_SLEEP_NO_CAP UINT64_MAX

/** Role of an lcore in a set. */
enum kvx_lcore_role {
	KVX_LCORE_ROLE_POLL = 0,    /**< Polling lcore (from `-l`/`-c`): runs a poll loop. */
	KVX_LCORE_ROLE_CONTROL = 1, /**< Control lcore: slow path (zmq_poll loop, timers). */
};

/** How the control lcore is chosen. */
enum kvx_lcore_control {
	/** Pick at validation: the next free lcore id, floating on the allowed CPUs that no
	 *  polling lcore uses (or on all allowed CPUs if none is left, like DPDK control
	 *  threads). The default. */
	KVX_LCORE_CONTROL_AUTO = 0,
	KVX_LCORE_CONTROL_NONE = 1,     /**< No control lcore (e.g. kvxfer-perf ring). */
	KVX_LCORE_CONTROL_EXPLICIT = 2, /**< Given with `--control-lcore`. */
};

/** Poller return values (docs/style.md §8 "Hot-path rules"). */
enum kvx_poll_result {
	KVX_POLL_IDLE = 0, /**< The poller found no work. */
	KVX_POLL_BUSY = 1, /**< The poller did work (dequeued, completed, posted ...). */
	/** No work now, and what it still has outstanding advances only when a file descriptor
	 *  in the lcore's wait set (kvx_lcore_add_wait_fd()) becomes readable or its waiter is
	 *  woken: the adaptive loop sleeps at once instead of spinning first. */
	KVX_POLL_WAIT = 2,
};

/* Option bits of kvx_lcore_cfg::given (which options appeared, for conflict checks). */
#define KVX_LCORE_OPT_LCORES 0x1u   /**< `-l` / `--lcores` given. */
#define KVX_LCORE_OPT_MASK 0x2u     /**< `-c` given. */
#define KVX_LCORE_OPT_MAIN 0x4u     /**< `--main-lcore` given. */
#define KVX_LCORE_OPT_CONTROL 0x8u  /**< `--control-lcore` given. */
#define KVX_LCORE_OPT_IDLE 0x10u    /**< `--idle` given. */

/* Flags of kvx_lcore_cfg_default(). */
/** Do not reserve a control lcore (sets KVX_LCORE_CONTROL_NONE). */
#define KVX_LCORE_DEFAULT_F_NO_CONTROL 0x1u

/* ============================================================================================
 * Options: parsed configuration
 * ========================================================================================== */

/** One lcore id and the CPUs its thread may run on. */
struct kvx_lcore_map {
	uint32_t lcore_id; /**< 0..KVX_LCORE_ID_MAX, or KVX_LCORE_ID_ANY (control AUTO only). */
	cpu_set_t cpus;    /**< CPUs the thread is pinned to (a floating set if several). */
};

/**
 * Parsed lcore configuration, shared by kvxfer-perf and the engine API.
 *
 * Initialise with kvx_lcore_cfg_init(), fill with kvx_lcore_parse_args() /
 * kvx_lcore_parse_opt() / kvx_lcore_cfg_from_strings() / kvx_lcore_cfg_default(), then
 * kvx_lcore_cfg_validate() before kvx_lcore_set_create(). Plain data (about 17 KiB): copy
 * freely; prefer heap or static storage over small thread stacks.
 */
struct kvx_lcore_cfg {
	uint32_t n_lcores;                          /**< Polling lcores in lcores[], 0..KVX_LCORE_MAX. */
	struct kvx_lcore_map lcores[KVX_LCORE_MAX]; /**< Polling lcores, ascending lcore_id. */
	uint32_t main_lcore;                        /**< `--main-lcore`, or KVX_LCORE_ID_ANY = first. */
	enum kvx_lcore_control control_mode;        /**< How the control lcore is chosen. */
	struct kvx_lcore_map control;               /**< Control lcore (valid unless mode NONE). */
	enum kvx_lcore_idle idle;                   /**< `--idle`; default ADAPTIVE. */
	bool share_cpus; /**< Allow the control lcore to share CPUs with polling lcores (set by
	                      kvx_lcore_cfg_default() on small machines, only with ADAPTIVE). */
	unsigned given;  /**< KVX_LCORE_OPT_* bits of the options seen so far. */
};

/**
 * Initialise a configuration to the defaults: no lcores, main = first, control AUTO,
 * idle ADAPTIVE, no sharing.
 *
 * @param[out] cfg  Configuration to fill; not NULL.
 * @par Thread safety  Caller's memory; any thread.
 */
KVX_API void kvx_lcore_cfg_init(struct kvx_lcore_cfg *cfg);

/**
 * Parse one lcore option into @p cfg (grammar only; no check against this host's CPUs).
 *
 * Accepted names (with or without the leading dashes given here):
 * - `-l` / `--lcores` LIST: `0-3,8` (lcore id == CPU) or DPDK's mapping form
 *   `<lcores[@cpus]>[,<lcores[@cpus]>...]`, where `lcores` and `cpus` are a number, a range
 *   `a-b`, or a group `(a,b-c,...)`; e.g. `1,2@(5-7),(3-5)@(0,2),(0,6),7-8`
 *   (docs/runtime-notes.md §1.1). Ranges must be ascending.
 * - `-c` HEXMASK: optional `0x`, blanks trimmed, bit j of the last digit = CPU j (compat
 *   alias of `-l`, DPDK-deprecated). Only one of `-c` and `-l` may be given.
 * - `--main-lcore` ID: one of the polling lcores (checked by kvx_lcore_cfg_validate()).
 * - `--control-lcore` SPEC: `N` (lcore N on CPU N) or `N@cpus` (`N@(0-1)`).
 * - `--idle` `busy` | `adaptive`.
 *
 * @param cfg        Configuration (kvx_lcore_cfg_init()); not NULL. Unchanged on error.
 * @param name       Option name, e.g. "-l", "--lcores", "lcores"; not NULL.
 * @param value      Option value; not NULL.
 * @param[out] err   Error message buffer (names the option and the offending core/value);
 *                   may be NULL.
 * @param errlen     Size of @p err in bytes (KVX_LCORE_ERRLEN recommended).
 * @return           1 if the option was consumed, 0 if @p name is not an lcore option.
 * @retval -EINVAL   Bad value (syntax, lcore id > KVX_LCORE_ID_MAX, lcore listed twice,
 *                   more than KVX_LCORE_MAX lcores, empty mask), or conflicting options
 *                   (`-c` with `-l`, an option given twice).
 * @par Thread safety  Caller's memory; any thread.
 * @see kvx_lcore_parse_args(), kvx_lcore_cfg_validate()
 */
KVX_API int kvx_lcore_parse_opt(struct kvx_lcore_cfg *cfg, const char *name, const char *value,
				char *err, size_t errlen);

/**
 * Parse and remove the lcore options from an argv vector (kvxfer-perf style).
 *
 * Recognises `-l X`, `-lX`, `--lcores X`, `--lcores=X`, `-c X`, `-cX`, `--main-lcore[=]X`,
 * `--control-lcore[=]X`, `--idle[=]X`; other arguments are kept in order. argv[0] is kept;
 * scanning stops at `--` (which is kept). Grammar only: call kvx_lcore_cfg_validate() next.
 *
 * @param argc       Number of entries in argv.
 * @param argv       Array[argc] of arguments; compacted in place on success (argv[result] is
 *                   set to NULL when argc > result).
 * @param cfg        Configuration (kvx_lcore_cfg_init()); not NULL.
 * @param[out] err   Error message buffer; may be NULL.
 * @param errlen     Size of @p err, bytes.
 * @return           The new argc (>= 1 when argc >= 1).
 * @retval -EINVAL   Bad or conflicting lcore option, or one without its value.
 * @par Thread safety  Caller's memory; any thread.
 */
KVX_API int kvx_lcore_parse_args(int argc, char **argv, struct kvx_lcore_cfg *cfg, char *err,
				 size_t errlen);

/** String form of the lcore options, for the engine params struct (NULL = not given). */
struct kvx_lcore_opts_str {
	const char *lcores;        /**< As `-l`/`--lcores`. */
	const char *coremask;      /**< As `-c`. */
	const char *main_lcore;    /**< As `--main-lcore`. */
	const char *control_lcore; /**< As `--control-lcore`; "none" = no control lcore. */
	const char *idle;          /**< As `--idle`. */
};

/**
 * Build a configuration from strings (engine API entry point): init, parse each non-NULL
 * field, and fill a default lcore set with kvx_lcore_cfg_default(@p default_pollers) when
 * neither `lcores` nor `coremask` is given, then validate against this host.
 *
 * @param s                Strings; not NULL (fields may be NULL).
 * @param default_pollers  Polling lcores to pick when no list is given, 1..KVX_LCORE_MAX.
 * @param[out] cfg         Filled and validated configuration; not NULL.
 * @param[out] err         Error message buffer; may be NULL.
 * @param errlen           Size of @p err, bytes.
 * @return                 0 on success.
 * @retval -EINVAL         A field failed to parse or validate (message names it).
 * @par Thread safety  Any thread.
 */
KVX_API int kvx_lcore_cfg_from_strings(const struct kvx_lcore_opts_str *s, unsigned default_pollers,
				       struct kvx_lcore_cfg *cfg, char *err, size_t errlen);

/**
 * Read this host's CPUs: the ones that exist and the ones this process may run on.
 *
 * @param[out] present  CPUs present (/sys/devices/system/cpu/present, else 0..nprocs_conf-1);
 *                      not NULL.
 * @param[out] allowed  sched_getaffinity(0) of the calling thread; not NULL.
 * @return              0 on success.
 * @retval -EINVAL      sched_getaffinity failed (mask larger than CPU_SETSIZE).
 * @par Thread safety  Any thread.
 */
KVX_API int kvx_lcore_host_cpus(cpu_set_t *present, cpu_set_t *allowed);

/**
 * Validate a parsed configuration against a set of present and allowed CPUs, and resolve
 * the defaults (main lcore = first polling lcore; control lcore AUTO = next free id on the
 * allowed CPUs no polling lcore uses, or all allowed CPUs if none is free).
 *
 * Checks, each with a message naming the lcore and CPU: at least one polling lcore; every CPU
 * exists; every CPU is allowed; `--main-lcore` is a polling lcore; the control lcore id is not
 * a polling lcore id and (unless share_cpus) its CPUs overlap no polling lcore's CPUs; share_cpus
 * requires the ADAPTIVE idle policy.
 *
 * @param cfg        Parsed configuration; resolved in place on success; not NULL.
 * @param present    CPUs that exist, or NULL for this host (kvx_lcore_host_cpus()).
 * @param allowed    CPUs this process may use, or NULL for this process's affinity.
 * @param[out] err   Error message buffer; may be NULL.
 * @param errlen     Size of @p err, bytes.
 * @return           0 on success.
 * @retval -EINVAL   A check failed (message names the lcore/CPU, e.g. "lcore 999: CPU 999
 *                   does not exist on this host (present: 0-1)").
 * @par Thread safety  Caller's memory; any thread.
 */
KVX_API int kvx_lcore_cfg_validate(struct kvx_lcore_cfg *cfg, const cpu_set_t *present,
				   const cpu_set_t *allowed, char *err, size_t errlen);

/**
 * Fill a default lcore set that fits this process's allowed CPUs (only if no `-l`/`-c` was
 * given; otherwise only the control lcore flags are applied).
 *
 * With A allowed CPUs (ascending c0, c1, ...) and N pollers:
 * - A >= N + 1 (or A >= N with KVX_LCORE_DEFAULT_F_NO_CONTROL): control lcore on c0, pollers
 *   lcore id == CPU on the next N CPUs (c1..cN). No CPU is shared.
 * - otherwise (e.g. N = 2 with a control lcore on a 2-CPU box): pollers get lcore ids
 *   1..N on CPUs c[(i+1) mod A], the control lcore id 0 floats on all allowed CPUs,
 *   share_cpus = true and the idle policy is forced to ADAPTIVE so that threads sharing a
 *   CPU yield and sleep instead of starving each other (documented trade-off: latency).
 *
 * @param cfg        Configuration (kvx_lcore_cfg_init(), maybe parsed); not NULL.
 * @param n_pollers  Polling lcores wanted, 1..KVX_LCORE_MAX.
 * @param flags      0 or KVX_LCORE_DEFAULT_F_NO_CONTROL.
 * @param[out] err   Error message buffer; may be NULL.
 * @param errlen     Size of @p err, bytes.
 * @return           0 on success (cfg not yet validated: call kvx_lcore_cfg_validate()).
 * @retval -EINVAL   n_pollers out of range, unknown flags, or no allowed CPU.
 * @par Thread safety  Any thread.
 */
KVX_API int kvx_lcore_cfg_default(struct kvx_lcore_cfg *cfg, unsigned n_pollers, unsigned flags,
				  char *err, size_t errlen);

/**
 * Format a CPU set as a DPDK-style list ("0,2,5-7").
 *
 * @param set       CPU set; not NULL.
 * @param[out] buf  Output buffer; not NULL; always NUL-terminated when len > 0.
 * @param len       Size of @p buf, bytes.
 * @return          Characters that the full string needs (like snprintf), excluding NUL.
 * @par Thread safety  Any thread.
 */
KVX_API int kvx_lcore_cpuset_format(const cpu_set_t *set, char *buf, size_t len);

/* ============================================================================================
 * Lcore threads
 * ========================================================================================== */

struct kvx_lcore_set;
struct kvx_lcore;
struct kvx_poller;

/**
 * Function launched on an lcore (kvx_lcore_launch()). Its return value is returned by
 * kvx_lcore_wait(). kvx_lcore_poll_loop() is the usual one.
 */
typedef int (*kvx_lcore_fn)(void *arg);

/**
 * Create the lcore set of a validated configuration: one pinned thread per polling lcore
 * and one for the control lcore (unless NONE). Threads start with their affinity already set
 * (pthread_attr_setaffinity_np) and wait, idle in a condition variable, for a launch.
 *
 * @param cfg       Validated configuration (kvx_lcore_cfg_validate()); not NULL; copied.
 * @param[out] out  New set; not NULL; set only on success.
 * @return          0 on success.
 * @retval -EINVAL  cfg has no lcores, or an unresolved main/control lcore.
 * @retval -ENOMEM  Allocation failed.
 * @retval -EAGAIN  pthread_create failed (thread limit).
 * @par Thread safety  Setup thread; not concurrently with another call on the same set.
 * @see kvx_lcore_set_destroy()
 */
KVX_API int kvx_lcore_set_create(const struct kvx_lcore_cfg *cfg, struct kvx_lcore_set **out);

/**
 * Stop every lcore (kvx_lcore_stop()), wait for launched functions to return, join and free
 * the threads and their pollers. NULL is a no-op.
 *
 * @param set  Set from kvx_lcore_set_create(), or NULL.
 * @par Thread safety  Setup thread; never from an lcore of this set.
 */
KVX_API void kvx_lcore_set_destroy(struct kvx_lcore_set *set);

/**
 * Number of lcores in the set (polling lcores plus the control lcore if any).
 *
 * @param set  Set; not NULL.
 * @return     Count, >= 1.
 */
KVX_API unsigned kvx_lcore_set_count(const struct kvx_lcore_set *set);

/**
 * Lcore at a position (0..count-1): polling lcores in ascending id, then the control lcore.
 *
 * @param set  Set; not NULL.
 * @param idx  Position, 0..kvx_lcore_set_count()-1.
 * @return     The lcore, or NULL if @p idx is out of range.
 * @par Thread safety  Any thread while the set exists.
 */
KVX_API struct kvx_lcore *kvx_lcore_set_at(const struct kvx_lcore_set *set, unsigned idx);

/**
 * Find an lcore by id.
 *
 * @param set  Set; not NULL.
 * @param id   Lcore id.
 * @return     The lcore, or NULL if @p id is not in the set.
 * @par Thread safety  Any thread while the set exists.
 */
KVX_API struct kvx_lcore *kvx_lcore_set_get(const struct kvx_lcore_set *set, uint32_t id);

/**
 * The main lcore (`--main-lcore`, default the first polling lcore).
 *
 * @param set  Set; not NULL.
 * @return     Never NULL.
 */
KVX_API struct kvx_lcore *kvx_lcore_set_main(const struct kvx_lcore_set *set);

/**
 * The control lcore, if the configuration has one.
 *
 * @param set  Set; not NULL.
 * @return     The control lcore, or NULL (KVX_LCORE_CONTROL_NONE).
 */
KVX_API struct kvx_lcore *kvx_lcore_set_control(const struct kvx_lcore_set *set);

/**
 * Launch a function on an lcore (rte_eal_remote_launch). Clears the lcore's stop flag first.
 *
 * @param lc        Lcore; not NULL.
 * @param fn        Function; not NULL. Runs on the lcore's thread.
 * @param arg       Its argument (may be NULL).
 * @return          0 when the lcore has accepted the function.
 * @retval -EBUSY   The lcore is running a function (launched and not yet waited for).
 * @retval -EINVAL  fn is NULL, or called from the lcore's own thread.
 * @par Thread safety  Any thread except @p lc's own; not concurrently with kvx_lcore_wait()
 *                     on the same lcore.
 * @par Context        Slow path (mutex + condition variable), not for the hot path.
 */
KVX_API int kvx_lcore_launch(struct kvx_lcore *lc, kvx_lcore_fn fn, void *arg);

/**
 * Wait until the lcore's launched function returns (blocks; does not spin).
 *
 * @param lc  Lcore; not NULL; not the calling thread's own lcore.
 * @return    The return value of the last launched function (0 if none was launched).
 * @par Thread safety  Any thread except @p lc's own.
 */
KVX_API int kvx_lcore_wait(struct kvx_lcore *lc);

/**
 * Launch the same function on every lcore of a role (all polling lcores, or the control one).
 * Checks first that all of them are idle; if one is running, launches nothing.
 *
 * @param set       Set; not NULL.
 * @param role      Which lcores.
 * @param fn        Function; not NULL.
 * @param arg       Argument passed to every call.
 * @return          0 on success.
 * @retval -EBUSY   One of the lcores was running; nothing was launched.
 * @retval -EINVAL  fn is NULL or called from an lcore of this set.
 * @par Thread safety  Setup thread.
 */
KVX_API int kvx_lcore_set_launch_all(struct kvx_lcore_set *set, enum kvx_lcore_role role,
				     kvx_lcore_fn fn, void *arg);

/**
 * Wait for every lcore of the set; return values are ignored (read them with kvx_lcore_wait()).
 *
 * @param set  Set; not NULL.
 * @par Thread safety  Setup thread.
 */
KVX_API void kvx_lcore_set_wait_all(struct kvx_lcore_set *set);

/**
 * Ask an lcore's poll loop to return: sets its stop flag (release) and wakes its waiter.
 * The loop returns 0 after finishing its current iteration.
 *
 * @param lc  Lcore; not NULL.
 * @par Thread safety  Any thread, any time (including the lcore itself).
 */
KVX_API void kvx_lcore_stop(struct kvx_lcore *lc);

/**
 * kvx_lcore_stop() on every lcore of the set.
 *
 * @param set  Set; not NULL.
 * @par Thread safety  Any thread.
 */
KVX_API void kvx_lcore_set_stop_all(struct kvx_lcore_set *set);

/**
 * Whether the lcore's stop flag is set (acquire). Long-running launched functions other than
 * kvx_lcore_poll_loop() poll this to honour kvx_lcore_stop().
 *
 * @param lc  Lcore; not NULL.
 * @return    true after kvx_lcore_stop(), until the next launch.
 */
KVX_API bool kvx_lcore_is_stopping(const struct kvx_lcore *lc);

/**
 * Whether a function is launched and not yet waited for.
 *
 * @param lc  Lcore; not NULL.
 * @return    true while RUNNING (including "finished but not waited for").
 */
KVX_API bool kvx_lcore_is_running(const struct kvx_lcore *lc);

/**
 * The lcore of the calling thread.
 *
 * @return  The lcore whose thread calls this, or NULL from any other thread.
 * @par Context  Thread-local read; hot-path safe.
 */
KVX_API struct kvx_lcore *kvx_lcore_self(void);

/**
 * Lcore id of the calling thread.
 *
 * @return  The id, or KVX_LCORE_ID_ANY from a thread that is not an lcore.
 */
KVX_API uint32_t kvx_lcore_self_id(void);

/**
 * Id of an lcore.
 *
 * @param lc  Lcore; not NULL.
 * @return    0..KVX_LCORE_ID_MAX.
 */
KVX_API uint32_t kvx_lcore_id(const struct kvx_lcore *lc);

/**
 * Role of an lcore.
 *
 * @param lc  Lcore; not NULL.
 * @return    KVX_LCORE_ROLE_POLL or KVX_LCORE_ROLE_CONTROL.
 */
KVX_API enum kvx_lcore_role kvx_lcore_role(const struct kvx_lcore *lc);

/**
 * The set an lcore belongs to.
 *
 * @param lc  Lcore; not NULL.
 * @return    Never NULL.
 */
KVX_API struct kvx_lcore_set *kvx_lcore_get_set(const struct kvx_lcore *lc);

/**
 * Attach per-lcore user state (e.g. the poller context of the runtime).
 *
 * @param lc   Lcore; not NULL.
 * @param ctx  Any pointer; kvxfer never dereferences it.
 * @par Thread safety  Set before launching, or from the lcore's own thread.
 */
KVX_API void kvx_lcore_set_ctx(struct kvx_lcore *lc, void *ctx);

/**
 * Per-lcore user state set with kvx_lcore_set_ctx().
 *
 * @param lc  Lcore; not NULL.
 * @return    The pointer (NULL if never set).
 */
KVX_API void *kvx_lcore_ctx(const struct kvx_lcore *lc);

/**
 * The CPU set the configuration pins the lcore to.
 *
 * @param lc        Lcore; not NULL.
 * @param[out] out  CPU set; not NULL.
 */
KVX_API void kvx_lcore_cpus(const struct kvx_lcore *lc, cpu_set_t *out);

/**
 * The affinity the lcore's thread actually has (pthread_getaffinity_np), for verification.
 *
 * @param lc        Lcore; not NULL.
 * @param[out] out  CPU set; not NULL.
 * @return          0 on success.
 * @retval -ESRCH   The thread no longer exists.
 * @retval -EINVAL  The kernel mask is larger than cpu_set_t.
 * @par Thread safety  Any thread.
 */
KVX_API int kvx_lcore_get_affinity(const struct kvx_lcore *lc, cpu_set_t *out);

/**
 * Kernel thread id of the lcore's thread (for /proc/self/task/<tid>/stat).
 *
 * @param lc  Lcore; not NULL.
 * @return    The tid (> 0).
 */
KVX_API pid_t kvx_lcore_tid(const struct kvx_lcore *lc);

/* ============================================================================================
 * Poll loop, pollers, idle policy
 * ========================================================================================== */

/**
 * Poller callback: do a bounded batch of work (e.g. dequeue a burst of 32) and return
 * KVX_POLL_BUSY if it did any, KVX_POLL_IDLE otherwise. Must not block.
 */
typedef int (*kvx_poller_fn)(void *arg);

/**
 * Register a poller on an lcore; its loop calls pollers in registration order.
 *
 * Rule: register from the lcore's own thread (any time, e.g. from another poller), or from
 * any thread while the lcore is not running (before kvx_lcore_launch() / after
 * kvx_lcore_wait()).
 *
 * @param lc        Lcore; not NULL.
 * @param fn        Callback; not NULL.
 * @param arg       Its argument (may be NULL).
 * @param name      Short name for diagnostics (copied, truncated to 31 bytes); may be NULL.
 * @param[out] out  Poller handle; may be NULL if the caller never unregisters.
 * @return          0 on success.
 * @retval -EINVAL  fn is NULL.
 * @retval -EBUSY   Called from another thread while the lcore is running.
 * @retval -ENOBUFS KVX_LCORE_MAX_POLLERS already registered.
 * @par Context  Slow path; no allocation.
 */
KVX_API int kvx_poller_register(struct kvx_lcore *lc, kvx_poller_fn fn, void *arg,
				const char *name, struct kvx_poller **out);

/**
 * Unregister a poller (same threading rule as kvx_poller_register()). A poller may
 * unregister itself from its own callback; it is not called again.
 *
 * @param p         Poller from kvx_poller_register(); not NULL.
 * @return          0 on success.
 * @retval -EBUSY   Called from another thread while its lcore is running.
 * @retval -ENOENT  Already unregistered.
 */
KVX_API int kvx_poller_unregister(struct kvx_poller *p);

/** Per-lcore idle policy parameters (kvx_lcore_set_idle()). */
struct kvx_lcore_idle_params {
	enum kvx_lcore_idle policy; /**< BUSY or ADAPTIVE. */
	uint32_t spin_polls;        /**< Empty polls spun before backoff (0 = KVX_LCORE_SPIN_POLLS). */
	uint32_t backoff_polls;     /**< Empty polls with sched_yield before sleeping
	                                 (0 = KVX_LCORE_BACKOFF_POLLS). */
	uint64_t max_sleep_ns;      /**< Longest sleep without a wake, ns (0 = KVX_LCORE_MAX_SLEEP_NS,
	                                 KVX_LCORE_SLEEP_NO_CAP = until a wake, a wait fd or a timer). */
	bool follow_waker;          /**< ADAPTIVE, waker's CPU < 64: the producer that wakes the
	                                 sleeping lcore first narrows its affinity to the
	                                 producer's own CPU when that CPU is one of the lcore's or
	                                 one the thread that launched the lcore may run on (an
	                                 lcore pinned to CPU 1, woken by the application on CPU 0,
	                                 makes its first poll on CPU 0), so the wake needs no other,
	                                 idle CPU (on a VM, a halted vCPU); the lcore widens back to
	                                 its own CPUs after that first poll. A polling lcore that
	                                 wakes another never moves it (that would put two pollers
	                                 on one CPU); any other thread does (the application's,
	                                 the control loop). Costs the waker one
	                                 sched_setaffinity(2) per sleep, the lcore one. Read when
	                                 the poll loop starts (a change made while it runs counts
	                                 from the next launch). Off by default here; the engine's
	                                 adaptive pollers turn it on (kvx_engine_params.follow_waker,
	                                 docs/performance.md §9). */
	uint32_t slice_us;          /**< Scheduler slice the lcore thread asks for while its poll loop
	                                 runs, us: 0 = the kernel's default, else
	                                 KVX_LCORE_SLICE_MIN_US..KVX_LCORE_SLICE_MAX_US
	                                 (sched_setattr(2) sched_runtime under SCHED_OTHER, nice
	                                 kept; Linux >= 6.12 honours it, older kernels ignore it).
	                                 A woken lcore with a short slice preempts the thread
	                                 running on its CPU at once instead of waiting for that
	                                 thread's slice (1.4 ms by default on 2 CPUs): with
	                                 follow_waker, that thread is the submitter, which may go on
	                                 computing. Left alone when the thread's policy is not
	                                 SCHED_OTHER when the loop starts; the default slice is restored when it
	                                 returns. Off by default here; the engine's adaptive pollers
	                                 ask for 100 us (kvx_engine_params.poller_slice_us,
	                                 docs/performance.md §11). */
};

/** Shortest and longest slice_us the kernel takes (it clamps sched_runtime to 0.1..100 ms). */
#define KVX_LCORE_SLICE_MIN_US 100u
#define KVX_LCORE_SLICE_MAX_US 100000u

/**
 * Set an lcore's idle policy (the set's configured policy is the default).
 *
 * @param lc        Lcore; not NULL.
 * @param p         Parameters; not NULL; copied.
 * @return          0 on success.
 * @retval -EINVAL  Unknown policy, or slice_us neither 0 nor within
 *                  KVX_LCORE_SLICE_MIN_US..KVX_LCORE_SLICE_MAX_US.
 * @retval -EBUSY   The lcore is running and the caller is not its thread.
 */
KVX_API int kvx_lcore_set_idle(struct kvx_lcore *lc, const struct kvx_lcore_idle_params *p);

/** Most file descriptors one lcore's adaptive sleep waits on besides its waiter. */
#define KVX_LCORE_MAX_WAIT_FDS 4u

/**
 * Add a file descriptor to the set the adaptive idle sleep waits on, next to the lcore's
 * waiter eventfd (e.g. an epoll fd over a poller's sockets): a sleeping lcore wakes when it
 * becomes readable (POLLIN, level). The fd must stay open while the lcore runs; the caller
 * owns it. Pollers then return KVX_POLL_WAIT when their outstanding work waits only on it.
 *
 * @param lc         Lcore; not NULL.
 * @param fd         File descriptor (>= 0).
 * @return           0 on success.
 * @retval -EINVAL   fd < 0.
 * @retval -ENOBUFS  KVX_LCORE_MAX_WAIT_FDS already added.
 * @retval -EBUSY    The lcore is running and the caller is not its thread.
 */
KVX_API int kvx_lcore_add_wait_fd(struct kvx_lcore *lc, int fd);

/** Poll loop accounting of one lcore (kvx_lcore_stats_get()). */
struct kvx_lcore_stats {
	uint64_t loops;       /**< Loop iterations (each calls every poller once). */
	uint64_t busy_loops;  /**< Iterations where at least one poller returned BUSY. */
	uint64_t busy_ns;     /**< Time in busy iterations, ns. */
	uint64_t idle_ns;     /**< Time in idle iterations, backoff and sleep included, ns. */
	uint64_t sleeps;      /**< Times the loop slept on its waiter (ADAPTIVE). */
	uint64_t wakeups;     /**< Sleeps ended by the waiter's eventfd or a readable wait fd (the
	                           others timed out: a timer deadline or max_sleep_ns). */
	uint64_t timers_run;  /**< Timer callbacks run by the loop (attached heap). */
	double util_pct;      /**< 100 * busy_ns / (busy_ns + idle_ns); 0 if no time yet. */
};

/**
 * Read an lcore's poll-loop accounting. Each counter is read atomically (relaxed) while the
 * loop runs; the set of counters is not one snapshot (they may be one iteration apart).
 * Counters accumulate over launches.
 *
 * @param lc        Lcore; not NULL.
 * @param[out] out  Stats; not NULL.
 * @par Thread safety  Any thread, any time.
 */
KVX_API void kvx_lcore_stats_get(const struct kvx_lcore *lc, struct kvx_lcore_stats *out);

/**
 * The poll loop (launch it with kvx_lcore_launch(lc, kvx_lcore_poll_loop, NULL)).
 *
 * Each iteration: call every registered poller; run the expired timers of the attached heap;
 * account the iteration as busy or idle (ns, from kvx_now_ns()); announce a QSBR quiescent
 * state; on an idle iteration apply the idle policy. The thread registers with QSBR at start
 * and unregisters at the end; it goes offline around every sleep. Returns 0 once
 * kvx_lcore_stop() was called.
 *
 * @param arg  Ignored (the lcore is kvx_lcore_self()).
 * @return     0 after stop.
 * @retval -EINVAL  Not called on an lcore thread.
 * @par Context  Runs on the lcore's thread until stopped.
 */
KVX_API int kvx_lcore_poll_loop(void *arg);

/**
 * Run one poll-loop iteration on the calling thread (no idle policy, no QSBR): for tests
 * and for embedding the pollers in another loop.
 *
 * @param lc  Lcore; not NULL; not running a poll loop on another thread.
 * @return    KVX_POLL_BUSY if any poller was busy, else KVX_POLL_IDLE.
 */
KVX_API int kvx_lcore_poll_once(struct kvx_lcore *lc);

/**
 * Wake an lcore that may be sleeping in its adaptive idle state (explicit wake).
 *
 * @param lc  Lcore; not NULL.
 * @par Thread safety  Any thread. Costs one eventfd write only if the lcore is asleep.
 */
KVX_API void kvx_lcore_wake(struct kvx_lcore *lc);

struct kvx_waiter;
/**
 * The lcore's waiter: attach it to the rings the lcore consumes (kvx_ring_set_waiter()) so that
 * producers wake it.
 *
 * @param lc  Lcore; not NULL.
 * @return    Never NULL; lives as long as the set.
 */
KVX_API struct kvx_waiter *kvx_lcore_waiter(struct kvx_lcore *lc);

struct kvx_timer_heap;
/**
 * Attach a timer heap to an lcore: its poll loop runs expired timers every iteration and
 * bounds its sleeps by the next deadline. The heap stays owned by the caller and is then
 * used only by that lcore's thread. Timers that ran do not count as work: work a callback
 * started is found by the pollers' re-check before the next sleep (and restarts the spin
 * then), so a periodic timer on an idle lcore costs one wake, its callback and two polls.
 *
 * @param lc        Lcore; not NULL.
 * @param heap      Heap, or NULL to detach.
 * @return          0 on success.
 * @retval -EBUSY   The lcore is running and the caller is not its thread.
 */
KVX_API int kvx_lcore_attach_timers(struct kvx_lcore *lc, struct kvx_timer_heap *heap);

#ifdef __cplusplus
}
#endif
#endif /* KVX_LCORE_H */
