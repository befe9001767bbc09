/* SPDX-License-Identifier: Apache-2.0 */
#ifndef KVX_TESTS_LCORE_TSAN_RUNNER_H
#define KVX_TESTS_LCORE_TSAN_RUNNER_H
/*
 * Runs the lcore stress test files under TSan without Criterion's process sandbox.
 *
 * Why: Criterion 2.4.1 (BoxFort) maps its inheritable arena at a random address in
 * 0x200000000000-0x7f0000000000 and gives up after 10 tries; gcc's TSan reserves nearly all of
 * that range for its shadow, so every Criterion binary aborts at start-up with "Could not
 * initialize inheritable arena" (Snaipe/Criterion#274; 0 of 20 runs started here). This header
 * maps the subset of Criterion's API that tests/lcore/test_{ring,lcore,waiter,rcu}.c use onto a
 * plain in-process runner: each Test() runs in its own fork()ed child (so a failing assert
 * reports and the other tests still run, as with Criterion), asserts print the expression and
 * exit the child with status 1. It is used only in -DKVX_SANITIZE=thread builds
 * (tests/lcore/CMakeLists.txt); every other build uses Criterion itself.
 */
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

struct kvx_tsan_test {
	const char *suite;
	const char *name;
	void (*fn)(void);
	struct kvx_tsan_test *next;
};

extern struct kvx_tsan_test *kvx_tsan_tests;
struct kvx_tsan_test *kvx_tsan_tests;

#define KVX_TSAN_CAT2(a, b) a##_##b
#define KVX_TSAN_CAT(a, b) KVX_TSAN_CAT2(a, b)

#define TestSuite(suite, ...) extern struct kvx_tsan_test *kvx_tsan_tests
#define Test(suite, name, ...)                                                                    \
	static void KVX_TSAN_CAT(suite, name)(void);                                              \
	__attribute__((constructor)) static void KVX_TSAN_CAT(reg_##suite, name)(void)            \
	{                                                                                         \
		static struct kvx_tsan_test t = {#suite, #name, KVX_TSAN_CAT(suite, name), NULL}; \
		t.next = kvx_tsan_tests;                                                          \
		kvx_tsan_tests = &t;                                                              \
	}                                                                                         \
	static void KVX_TSAN_CAT(suite, name)(void)

#define KVX_TSAN_FAIL(what)                                                                       \
	do {                                                                                      \
		fprintf(stderr, "%s:%d: assertion failed: %s\n", __FILE__, __LINE__, what);       \
		fflush(stderr);                                                                   \
		_exit(1);                                                                         \
	} while (0)
#define KVX_TSAN_CHECK(cond, what)                                                                \
	do {                                                                                      \
		if (!(cond))                                                                      \
			KVX_TSAN_FAIL(what);                                                      \
	} while (0)

#define cr_assert(c, ...) KVX_TSAN_CHECK((c), #c)
#define cr_assert_not(c, ...) KVX_TSAN_CHECK(!(c), "!(" #c ")")
#define cr_assert_eq(a, b, ...) KVX_TSAN_CHECK((a) == (b), #a " == " #b)
#define cr_assert_neq(a, b, ...) KVX_TSAN_CHECK((a) != (b), #a " != " #b)
#define cr_assert_lt(a, b, ...) KVX_TSAN_CHECK((a) < (b), #a " < " #b)
#define cr_assert_leq(a, b, ...) KVX_TSAN_CHECK((a) <= (b), #a " <= " #b)
#define cr_assert_gt(a, b, ...) KVX_TSAN_CHECK((a) > (b), #a " > " #b)
#define cr_assert_geq(a, b, ...) KVX_TSAN_CHECK((a) >= (b), #a " >= " #b)
#define cr_assert_null(p, ...) KVX_TSAN_CHECK((p) == NULL, #p " == NULL")
#define cr_assert_not_null(p, ...) KVX_TSAN_CHECK((p) != NULL, #p " != NULL")
#define cr_assert_arr_eq(a, b, n, ...) KVX_TSAN_CHECK(!memcmp((a), (b), (n)), #a " == " #b)
#define cr_assert_float_eq(a, b, eps, ...) KVX_TSAN_CHECK(fabs((double)(a) - (double)(b)) <= (eps), #a " ~= " #b)
#define cr_assert_fail(...) KVX_TSAN_FAIL("cr_assert_fail")
#define cr_log_info(...)                                                                          \
	do {                                                                                      \
		fprintf(stderr, "[info] " __VA_ARGS__);                                           \
		fputc('\n', stderr);                                                              \
	} while (0)
#define cr_skip_test(...)                                                                         \
	do {                                                                                      \
		fprintf(stderr, "[skip] " __VA_ARGS__);                                           \
		fputc('\n', stderr);                                                              \
		_exit(77);                                                                        \
	} while (0)

int main(void)
{
	int failed = 0, passed = 0, skipped = 0;
	for (struct kvx_tsan_test *t = kvx_tsan_tests; t; t = t->next) {
		fflush(NULL);
		pid_t pid = fork();
		if (pid == 0) {
			t->fn();
			fflush(NULL);
			_exit(0);
		}
		int st = 0;
		if (pid < 0 || waitpid(pid, &st, 0) < 0) {
			failed++;
			continue;
		}
		bool ok = WIFEXITED(st) && WEXITSTATUS(st) == 0;
		bool skip = WIFEXITED(st) && WEXITSTATUS(st) == 77;
		fprintf(stderr, "[%s] %s::%s\n", ok ? "PASS" : skip ? "SKIP" : "FAIL", t->suite, t->name);
		passed += ok;
		skipped += skip;
		failed += !ok && !skip;
	}
	fprintf(stderr, "[====] Synthesis: Passing: %d | Failing: %d | Skipped: %d\n", passed, failed,
		skipped);
	return failed ? 1 : 0;
}
#endif
