/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvxfer-perf notify through the real binary: besides kvxfer's own notification round trip it
 * measures the plain ZMQ DEALER/ROUTER echo peer in the same run, sample for sample, with the
 * same encoded write_done bytes, and reports the ratio. No speed is asserted.
 */
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <criterion/criterion.h>
#include <jansson.h>

#ifndef KVX_PERF_BIN
#error KVX_PERF_BIN must name the kvxfer-perf binary
#endif

TestSuite(bench_perf_notify, .timeout = 300.0);

static double num(json_t *o, const char *k)
{
	json_t *v = json_object_get(o, k);
	cr_assert(json_is_number(v), "%s missing", k);
	return json_number_value(v);
}

Test(bench_perf_notify, zmq_echo_peer_is_measured_with_the_same_samples_and_reported_as_a_ratio)
{
	char dir[] = "/tmp/kvx-notify-test.XXXXXX", cmd[512], json[64], log[64];
	cr_assert_not_null(mkdtemp(dir));
	snprintf(json, sizeof(json), "%s/out.json", dir);
	snprintf(log, sizeof(log), "%s/log", dir);
	snprintf(cmd, sizeof(cmd), "'%s' notify --iters 60 --msgs 200 --hs-iters 2 --json %s >%s 2>&1", KVX_PERF_BIN,
		 json, log);
	int st = system(cmd);
	cr_assert(st != -1 && WIFEXITED(st) && WEXITSTATUS(st) == 0, "%s exited %d (see %s)", cmd, st, log);
	json_error_t err;
	json_t *j = json_load_file(json, 0, &err);
	cr_assert_not_null(j, "%s: %s", json, err.text);
	json_t *k = json_object_get(j, "notify_rtt"), *z = json_object_get(j, "zmq_echo_rtt");
	cr_assert_eq(num(k, "n"), 60);
	cr_assert_eq(num(z, "n"), 60, "the peer takes as many samples as kvxfer");
	cr_assert(num(z, "p50_us") > 0 && num(z, "p50_us") <= num(z, "p99_us"));
	cr_assert_eq(num(j, "rtt_rounds"), 3);
	cr_assert_gt(num(j, "zmq_rtt_ratio_p50"), 0);
	/* The echo carries an encoded write_done for "tx-<n>": a msgpack map of a few dozen bytes. */
	double b = num(j, "zmq_echo_msg_bytes");
	cr_assert(b >= 20 && b <= 128, "echo message of %.0f bytes", b);
	json_decref(j);
	unlink(json);
	unlink(log);
	rmdir(dir);
}
