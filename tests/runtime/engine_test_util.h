/* SPDX-License-Identifier: Apache-2.0 */
#ifndef KVX_TESTS_ENGINE_TEST_UTIL_H
#define KVX_TESTS_ENGINE_TEST_UTIL_H
/* Helpers for engine-level tests that use only the public engine API (include/kvxfer/engine.h)
 * with real engines on loopback: start an engine over split K/V host layers with a known byte
 * pattern, track completions by transfer id, wait on real conditions with a bounded deadline,
 * and play a MoRIIO peer process on the notify channel with a real libzmq DEALER.
 * Any test in tests/runtime may use them (link engine_test_util.c and PkgConfig::ZMQ). */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "kvxfer/control.h"
#include "kvxfer/engine.h"

/** Layers per test engine, and logical blocks per layer. */
#define ET_NL 2
#define ET_NB 16
/** Bytes of one block of one K (or V) plane: block_size 4 x 2 heads x head size 8 x bf16. */
#define ET_BLOCK 128
/** Generous deadline for anything that crosses the loopback, ns (slow, shared 2-core machine). */
#define ET_DEADLINE_NS 20000000000ull
/** Transfers one tracker follows. */
#define ET_TRACK_MAX 256

/** One test engine and its split K/V layers `[2, ET_NB, 4, 2, 8]` (bf16). */
struct et_eng {
	struct kvx_engine *e;
	uint8_t *mem[ET_NL]; /* Array[2 * ET_NB * ET_BLOCK] per layer: K plane then V plane */
	uint16_t hs, nt;     /* bound handshake / notify ports */
};

/** Parameters for a tcp engine on ephemeral loopback ports, 8 transfers of <= ET_NB blocks. */
void et_params(struct kvx_engine_params *p, enum kvx_sched_role role, enum kvx_sched_mode mode);

/** Create, register ET_NL split layers and start; pattern true fills every block with
 * et_pattern(), false with zeros. Asserts on failure. */
void et_start(struct et_eng *g, const struct kvx_engine_params *p, bool pattern);

/** et_start() in two steps: create and register (asserts), then start and read the bound
 * ports (returns 0 or the kvx_engine_start() errno, e.g. -EADDRINUSE with fixed ports). */
void et_create(struct et_eng *g, const struct kvx_engine_params *p, bool pattern);
int et_start_layers(struct et_eng *g);

/** et_create() over layer memory the caller placed in g->mem[0..ET_NL) (each at least
 * 2 * ET_NB * ET_BLOCK bytes, freed by the caller, not et_free()): create the engine, fill the
 * layers (et_pattern() or zeros) and register them. Asserts on failure. */
void et_create_over(struct et_eng *g, const struct kvx_engine_params *p, bool pattern);

/** Destroy the engine and free its layers. */
void et_free(struct et_eng *g);

/** A producer P (patterned layers) and a consumer D (zeroed layers) in @p mode with
 * et_params() defaults; et_pair_free() destroys both. */
void et_pair_start(struct et_eng *p, struct et_eng *d, enum kvx_sched_mode mode);
void et_pair_free(struct et_eng *p, struct et_eng *d);

/** The fill byte of (layer, plane 0=K/1=V, block) on a patterned engine; never 0. */
uint8_t et_pattern(uint32_t layer, uint32_t plane, uint32_t block);

/** Address of one block of one plane of one layer. */
uint8_t *et_block(const struct et_eng *g, uint32_t layer, uint32_t plane, uint32_t block);

/** Assert that every plane of every layer of D's block dst[i] holds P's pattern of src[i],
 * and (if others_zero) that every other block of D is still zero. */
void et_expect_blocks(const struct et_eng *d, const uint32_t *dst, const uint32_t *src, size_t n, bool others_zero);

/** Completion tracker: per followed transfer id, terminal status (-1 none), error, releases. */
struct et_track {
	const char *tid[ET_TRACK_MAX];
	int status[ET_TRACK_MAX];
	int error[ET_TRACK_MAX];
	int released[ET_TRACK_MAX];
	uint64_t bytes[ET_TRACK_MAX];
	size_t n;
};

/** Follow @p tid (status -1, no releases yet). Returns its index. */
size_t et_follow(struct et_track *t, const char *tid);

/** Poll one burst of completions into @p t; asserts on a completion for an unfollowed id or a
 * second terminal completion for one transfer. */
void et_pump(struct kvx_engine *e, struct et_track *t);

/** Pump until transfer @p tid is terminal (and, if want_release, has a BLOCKS_RELEASED) or
 * ET_DEADLINE_NS passes. Returns whether the condition was met. */
bool et_wait(struct kvx_engine *e, struct et_track *t, const char *tid, bool want_release);

/** et_wait() for @p tid, then assert it ended KVX_CPL_DONE with error 0 (message names the
 * status and error otherwise). Returns the transfer's tracker index. */
size_t et_expect_done(struct kvx_engine *e, struct et_track *t, const char *tid, bool want_release);

/** Pump @p e (into @p t) until @p pred(e, arg) holds or ET_DEADLINE_NS passes. */
bool et_wait_until(struct kvx_engine *e, struct et_track *t, bool (*pred)(struct kvx_engine *e, void *arg),
		   void *arg);

/** Sum of the per-lcore byte counters. */
uint64_t et_bytes_moved(struct kvx_engine *e);

/** A real libzmq DEALER on 127.0.0.1:port, playing a MoRIIO process on the notify channel. */
struct et_dealer {
	void *ctx, *sock;
};

void et_dealer_open(struct et_dealer *d, uint16_t port);
/** Encode @p m with the kvxfer codec and send it as one frame. */
void et_dealer_send(struct et_dealer *d, const struct kvx_msg_notify *m);
/** Close with a bounded linger: returns once queued frames were handed to the peer. */
void et_dealer_close(struct et_dealer *d);

/** Read exactly @p n bytes from @p fd (a pipe to a child process): 0, or -1 on EOF/error. */
int et_read_all(int fd, void *b, size_t n);
/** Write @p n bytes to @p fd in one write(): 0, or -1. */
int et_write_all(int fd, const void *b, size_t n);

/* ---- Blocks, counters and conditions that several engine tests check ---- */

/** Peer on 127.0.0.1 with handshake port @p hs and notify port @p nt. */
struct kvx_engine_peer et_peer(uint16_t hs, uint16_t nt);

/** Set every byte of every layer of @p g (both planes, all ET_NB blocks) to @p v. */
void et_fill(struct et_eng *g, uint8_t v);

/** Whether every byte of block @p b, in both planes of every layer of @p g, is @p v. */
bool et_block_is(const struct et_eng *g, uint32_t b, uint8_t v);

/** Whether block @p b of @p g holds the pattern of block @p src of a patterned engine
 * (et_pattern() per layer and plane), in both planes of every layer. */
bool et_block_is_pattern(const struct et_eng *g, uint32_t b, uint32_t src);

/** Data ops the engine's pollers posted so far, summed over its lcores (a lease read is not a
 * data op). App thread. */
uint64_t et_ops_posted(struct kvx_engine *e);

/** et_wait_until() predicate: the engine received at least `*(const uint64_t *)arg`
 * notifications in all (kvx_engine_stats.notifications_received). */
bool et_notes_at_least(struct kvx_engine *e, void *arg);

/** WRITE producer: make every layer of @p tid ready (kvx_xfer_layer_ready(), no event), then
 * seal it after ET_NL layers. Returns 0 or the first failing call's negative errno. */
int et_write_layers(struct kvx_engine *e, const char *tid);

/** One whole READ between two loopback engines: @p p serves @p src, @p d reads them into
 * @p dst, both as @p tid (followed in @p tp and @p td). Asserts that D ends DONE, that P ends
 * DONE with its blocks released, and that D's blocks dst[i] hold P's pattern of src[i]
 * (with others_zero: and every other block of D is zero). Returns D's tracker index. */
size_t et_read_done(struct et_eng *p, struct et_track *tp, struct et_eng *d, struct et_track *td, const char *tid,
		    const uint32_t *dst, const uint32_t *src, size_t n, bool others_zero);

/* ---- Engines in child processes ----
 * A test that runs an engine in a forked child talks to it over two pipes: the child runs
 * fn(arg, to_parent, from_parent) and exits with its return value (0 = success; a non-zero
 * code names the step that failed). The parent does the asserting: it checks the child's
 * messages and its exit status. */

/** Bound handshake and notify ports of an engine, as one side sends them to the other. */
struct et_ports {
	uint16_t hs, nt;
};

/** The bound ports of @p g. */
struct et_ports et_ports_of(const struct et_eng *g);

/** A child process and the parent's ends of its two pipes. */
struct et_child {
	pid_t pid;
	int to;   /* parent -> child */
	int from; /* child -> parent */
};

/** Body of a child process: the exit code (0 = success). */
typedef int (*et_child_fn)(void *arg, int to_parent, int from_parent);

/** Fork a child that runs fn(arg, ...) and _exit()s with its result (@p arg is the parent's
 * pointer, valid in the child's copy of the address space). Asserts on pipe/fork failure. */
void et_child_spawn(struct et_child *c, et_child_fn fn, void *arg);

/** Send @p n bytes to the child (asserts). */
void et_child_send(const struct et_child *c, const void *b, size_t n);

/** Read exactly @p n bytes from the child; asserts with message @p what (e.g. "the producer
 * child failed to start") when it exited or the pipe failed first. */
void et_child_recv(const struct et_child *c, void *b, size_t n, const char *what);

/** SIGKILL the child, reap it (asserts it died of SIGKILL) and close its pipes. */
void et_child_kill9(struct et_child *c);

/** Wait for the child to exit (it was told to by the test's own protocol), assert that it
 * exited with 0 (message names @p who and the status otherwise), close its pipes. */
void et_child_join(struct et_child *c, const char *who);

#endif /* KVX_TESTS_ENGINE_TEST_UTIL_H */
