/* SPDX-License-Identifier: Apache-2.0 */
#include <criterion/criterion.h>
#include <errno.h>
#include <string.h>

#include "kvxfer/common.h"

Test(common, strerror_accepts_negative_and_positive_errno)
{
	cr_assert_str_eq(kvx_strerror(0), "Success");
	cr_assert_str_eq(kvx_strerror(-ETIMEDOUT), kvx_strerror(ETIMEDOUT));
	cr_assert_str_eq(kvx_strerror(-ENOBUFS), "No buffer space available");
}

Test(common, now_ns_is_monotonic)
{
	uint64_t a = kvx_now_ns();
	uint64_t b = kvx_now_ns();
	cr_assert_geq(b, a);
	cr_assert_gt(a, 0);
}

Test(common, ratelimit_suppresses_within_interval)
{
	struct kvx_ratelimit rl = {.interval_ns = 3600ull * 1000000000ull};
	uint64_t sup = 99;
	cr_assert(kvx_ratelimit_ok(&rl, &sup));
	cr_assert_eq(sup, 0);
	cr_assert_not(kvx_ratelimit_ok(&rl, NULL));
	cr_assert_not(kvx_ratelimit_ok(&rl, NULL));
	cr_assert_eq(rl.suppressed, 2);
	rl.last_ns -= rl.interval_ns; /* pretend the interval elapsed */
	cr_assert(kvx_ratelimit_ok(&rl, &sup));
	cr_assert_eq(sup, 2);
	cr_assert_eq(rl.suppressed, 0);
}
