/* SPDX-License-Identifier: Apache-2.0 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <criterion/criterion.h>

#include "trace_replay.h"

TestSuite(bench_trace_wire, .timeout = 30.0);

Test(bench_trace_wire, xfer_id_round_trips)
{
	char buf[32];
	uint64_t v = 0;
	trace_xfer_id(42, buf, sizeof(buf));
	cr_assert_str_eq(buf, "tx-000042");
	cr_assert_eq(trace_xfer_id_parse(buf, &v), 0);
	cr_assert_eq(v, 42);
	trace_xfer_id(12345678, buf, sizeof(buf));
	cr_assert_str_eq(buf, "tx-12345678");
	cr_assert_eq(trace_xfer_id_parse(buf, &v), 0);
	cr_assert_eq(v, 12345678);
	cr_assert_eq(trace_xfer_id_parse("tx-", &v), -EINVAL);
	cr_assert_eq(trace_xfer_id_parse("rx-1", &v), -EINVAL);
	cr_assert_eq(trace_xfer_id_parse("tx-12a", &v), -EINVAL);
	cr_assert_eq(trace_xfer_id_parse("tx-99999999999999999999", &v), -EINVAL);
}

Test(bench_trace_wire, message_with_block_ids_arrives_intact)
{
	int sv[2];
	cr_assert_eq(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
	struct trace_msg_blocks b = {.idx = 7, .blocks = 5, .hit_blocks = 2, .n = 3};
	uint32_t ids[3] = {10, 11, 4000000000u};
	cr_assert_eq(trace_msg_send(sv[0], TRACE_MSG_READ, &b, sizeof(b), ids, sizeof(ids)), 0);
	cr_assert_eq(trace_msg_send(sv[0], TRACE_MSG_QUIT, NULL, 0, NULL, 0), 0);
	struct trace_msg_hdr h;
	void *p;
	cr_assert_eq(trace_msg_recv(sv[1], &h, &p), 0);
	cr_assert_eq(h.type, TRACE_MSG_READ);
	cr_assert_eq(h.len, sizeof(b) + sizeof(ids));
	cr_assert_eq(memcmp(p, &b, sizeof(b)), 0);
	cr_assert_eq(memcmp((char *)p + sizeof(b), ids, sizeof(ids)), 0);
	free(p);
	cr_assert_eq(trace_msg_recv(sv[1], &h, &p), 0);
	cr_assert_eq(h.type, TRACE_MSG_QUIT);
	cr_assert_eq(h.len, 0);
	cr_assert_null(p);
	close(sv[0]);
	cr_assert_eq(trace_msg_recv(sv[1], &h, &p), -ECONNRESET);
	close(sv[1]);
}

Test(bench_trace_wire, oversized_and_truncated_messages_are_errors)
{
	int sv[2];
	cr_assert_eq(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
	struct trace_msg_hdr big = {.type = TRACE_MSG_DONE, .len = TRACE_MSG_MAX + 1};
	cr_assert_eq(write(sv[0], &big, sizeof(big)), (ssize_t)sizeof(big));
	struct trace_msg_hdr h;
	void *p;
	cr_assert_eq(trace_msg_recv(sv[1], &h, &p), -EPROTO);
	cr_assert_null(p);
	struct trace_msg_hdr cut = {.type = TRACE_MSG_DONE, .len = 100};
	cr_assert_eq(write(sv[0], &cut, sizeof(cut)), (ssize_t)sizeof(cut));
	cr_assert_eq(write(sv[0], "abc", 3), 3);
	close(sv[0]);
	cr_assert_eq(trace_msg_recv(sv[1], &h, &p), -ECONNRESET);
	cr_assert_null(p);
	close(sv[1]);
}
