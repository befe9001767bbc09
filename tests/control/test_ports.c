/* SPDX-License-Identifier: Apache-2.0 */
/* Pure helpers: ports, ranks, addresses (docs/protocol.md §2.1, §3.4, §3.5, §4.5). */
#include <criterion/criterion.h>
#include <errno.h>
#include <string.h>

#include "kvxfer/control.h"

TestSuite(control_ports, .timeout = 10.0);

Test(control_ports, injective_offsets_are_distinct_over_dp_tp)
{
	const uint32_t shapes[][2] = {{2, 2}, {2, 4}, {4, 2}, {8, 8}};
	for (size_t s = 0; s < 4; s++) {
		uint32_t dp = shapes[s][0], tp = shapes[s][1];
		uint8_t seen[64] = {0};
		for (uint32_t d = 0; d < dp; d++)
			for (uint32_t t = 0; t < tp; t++) {
				uint32_t off = 999;
				cr_assert_eq(kvx_ctl_port_offset(KVX_CTL_PORT_INJECTIVE, d, t, tp, &off), 0);
				cr_assert_eq(off, d * tp + t);
				cr_assert_eq(seen[off], 0, "collision at dp %u tp %u", d, t);
				seen[off] = 1;
			}
	}
}

Test(control_ports, vllm_mode_collides_as_documented)
{
	uint32_t a, b;
	cr_assert_eq(kvx_ctl_port_offset(KVX_CTL_PORT_VLLM, 1, 0, 2, &a), 0);
	cr_assert_eq(kvx_ctl_port_offset(KVX_CTL_PORT_VLLM, 0, 1, 2, &b), 0);
	cr_assert_eq(a, 1);
	cr_assert_eq(b, 1);
}

Test(control_ports, bad_arguments_return_einval)
{
	uint32_t off;
	uint16_t port;
	cr_assert_eq(kvx_ctl_port_offset(KVX_CTL_PORT_INJECTIVE, 1, 0, 0, &off), -EINVAL);
	cr_assert_eq(kvx_ctl_port_offset(KVX_CTL_PORT_VLLM, 1, 0, 0, &off), -EINVAL);
	cr_assert_eq(kvx_ctl_port_offset(KVX_CTL_PORT_INJECTIVE, 0, 2, 2, &off), -EINVAL);
	cr_assert_eq(kvx_ctl_port_offset((enum kvx_ctl_port_mode)7, 0, 0, 1, &off), -EINVAL);
	cr_assert_eq(kvx_ctl_port(KVX_CTL_PORT_INJECTIVE, 65535, 1, 0, 1, &port), -EINVAL);
	cr_assert_eq(kvx_ctl_port(KVX_CTL_PORT_INJECTIVE, 0, 0, 0, 1, &port), -EINVAL);
	cr_assert_eq(kvx_ctl_port(KVX_CTL_PORT_INJECTIVE, 65534, 1, 0, 1, &port), 0);
	cr_assert_eq(port, 65535);
}

Test(control_ports, remote_tp_rank_maps_both_directions)
{
	uint32_t r;
	char err[128];
	for (uint32_t i = 0; i < 4; i++) {
		cr_assert_eq(kvx_ctl_remote_tp_rank(i, 4, 4, &r, NULL, 0), 0);
		cr_assert_eq(r, i);
		cr_assert_eq(kvx_ctl_remote_tp_rank(i, 4, 8, &r, NULL, 0), 0);
		cr_assert_eq(r, 2 * i);
	}
	const uint32_t want[] = {0, 0, 1, 1, 2, 2, 3, 3};
	for (uint32_t i = 0; i < 8; i++) {
		cr_assert_eq(kvx_ctl_remote_tp_rank(i, 8, 4, &r, NULL, 0), 0);
		cr_assert_eq(r, want[i]);
	}
	cr_assert_eq(kvx_ctl_remote_tp_rank(3, 4, 0, &r, NULL, 0), 0, "0 = same as local");
	cr_assert_eq(r, 3);
	cr_assert_eq(kvx_ctl_remote_tp_rank(0, 6, 4, &r, err, sizeof(err)), -EINVAL);
	cr_assert_not_null(strstr(err, "multiple"), "%s", err);
	cr_assert_eq(kvx_ctl_remote_tp_rank(0, 4, 6, &r, err, sizeof(err)), -EINVAL);
	cr_assert_not_null(strstr(err, "multiple"), "%s", err);
	cr_assert_eq(kvx_ctl_remote_tp_rank(4, 4, 4, &r, err, sizeof(err)), -EINVAL);
	cr_assert_eq(kvx_ctl_remote_tp_rank(0, 0, 4, &r, err, sizeof(err)), -EINVAL);
}

Test(control_ports, expected_acks_fan_in)
{
	uint32_t n = 0;
	cr_assert_eq(kvx_ctl_expected_acks(4, 4, &n), 0);
	cr_assert_eq(n, 1);
	cr_assert_eq(kvx_ctl_expected_acks(8, 4, &n), 0);
	cr_assert_eq(n, 1);
	cr_assert_eq(kvx_ctl_expected_acks(4, 8, &n), 0);
	cr_assert_eq(n, 2);
	cr_assert_eq(kvx_ctl_expected_acks(4, 6, &n), -EINVAL);
	cr_assert_eq(kvx_ctl_expected_acks(0, 6, &n), -EINVAL);
	cr_assert_eq(kvx_ctl_expected_acks(4, 0, &n), -EINVAL);
}

Test(control_ports, zmq_path_brackets_ipv6)
{
	char b[64];
	cr_assert_eq(kvx_ctl_zmq_path("10.0.0.1", 7000, b, sizeof(b)), 19);
	cr_assert_str_eq(b, "tcp://10.0.0.1:7000");
	cr_assert_eq(kvx_ctl_zmq_path("::1", 6301, b, sizeof(b)), 16);
	cr_assert_str_eq(b, "tcp://[::1]:6301");
	cr_assert_eq(kvx_ctl_zmq_path("[fe80::1]", 1, b, sizeof(b)), 17);
	cr_assert_str_eq(b, "tcp://[fe80::1]:1");
	cr_assert_eq(kvx_ctl_zmq_path("", 1, b, sizeof(b)), -EINVAL);
	cr_assert_eq(kvx_ctl_zmq_path("h", 0, b, sizeof(b)), -EINVAL);
	cr_assert_eq(kvx_ctl_zmq_path("10.0.0.1", 7000, b, 10), -EMSGSIZE);
}

Test(control_ports, zmq_address_parse_and_format)
{
	struct kvx_ctl_addr a;
	char err[128];
	const char *s = " host : 10.1.2.3 , handshake:8405,notify: 61005,extra:1";
	cr_assert_eq(kvx_ctl_zmq_address_parse(s, strlen(s), &a, err, sizeof(err)), 0, "%s", err);
	cr_assert_str_eq(a.host, "10.1.2.3");
	cr_assert_eq(a.handshake_port, 8405);
	cr_assert_eq(a.notify_port, 61005);
	char b[128];
	int n = kvx_ctl_zmq_address_format(&a, b, sizeof(b));
	cr_assert_str_eq(b, "host:10.1.2.3,handshake:8405,notify:61005");
	cr_assert_eq(n, (int)strlen(b));
	cr_assert_eq(kvx_ctl_zmq_address_format(&a, b, 8), -EMSGSIZE);
	s = "host:h,handshake:x1,notify:1";
	cr_assert_eq(kvx_ctl_zmq_address_parse(s, strlen(s), &a, err, sizeof(err)), -EINVAL);
	cr_assert_not_null(strstr(err, "Malformed zmq_address"));
	s = "host:h,handshake:70000,notify:1";
	cr_assert_eq(kvx_ctl_zmq_address_parse(s, strlen(s), &a, err, sizeof(err)), -EINVAL);
	s = "handshake:1,notify:1";
	cr_assert_eq(kvx_ctl_zmq_address_parse(s, strlen(s), &a, err, sizeof(err)), -EINVAL);
	cr_assert_not_null(strstr(err, "host"));
}

Test(control_ports, reqid_format_roundtrip)
{
	char rid[512], p[256], d[256];
	const char *pa = "host:10.0.0.1,handshake:6301,notify:61005";
	const char *da = "host:::1,handshake:6302,notify:61006";
	int n = kvx_ctl_reqid_format(pa, da, "0123456789abcdef0123456789abcdef", rid, sizeof(rid));
	cr_assert_gt(n, 0);
	cr_assert_eq(kvx_ctl_reqid_prefill_addr(rid, p, sizeof(p)), (int)strlen(pa));
	cr_assert_str_eq(p, pa);
	cr_assert_eq(kvx_ctl_reqid_decode_addr(rid, d, sizeof(d)), (int)strlen(da));
	cr_assert_str_eq(d, da);
	cr_assert_eq(kvx_ctl_reqid_format(pa, da, "0123456789ABCDEF0123456789abcdef", rid,
					  sizeof(rid)), -EINVAL);
	cr_assert_eq(kvx_ctl_reqid_prefill_addr("plain-request", p, sizeof(p)), -ENOENT);
	cr_assert_eq(kvx_ctl_reqid_decode_addr("plain-request", d, sizeof(d)), -ENOENT);
	/* Decode part without the 32-hex tail does not match. */
	cr_assert_eq(kvx_ctl_reqid_decode_addr("___decode_addr_host:a,handshake:1,notify:2_xyz", d,
					       sizeof(d)), -ENOENT);
	cr_assert_eq(kvx_ctl_reqid_prefill_addr(rid, p, 4), -EMSGSIZE);
}

Test(control_ports, engine_key_format)
{
	char b[128];
	cr_assert_gt(kvx_ctl_engine_key(KVX_CTL_ROLE_CONSUMER, "10.0.0.5", 6301, 0, 0, b, sizeof(b)), 0);
	cr_assert_str_eq(b, "consumer:10.0.0.5:6301:tp0:dp0");
	cr_assert_gt(kvx_ctl_engine_key(KVX_CTL_ROLE_PRODUCER, "h", 1, 3, 2, b, sizeof(b)), 0);
	cr_assert_str_eq(b, "producer:h:1:tp3:dp2");
	cr_assert_eq(kvx_ctl_engine_key(KVX_CTL_ROLE_PRODUCER, "h", 1, 3, 2, b, 5), -EMSGSIZE);
}

Test(control_ports, peer_tp_size_resolution)
{
	cr_assert_eq(kvx_ctl_peer_tp_size(0, 0, 4), 4);
	cr_assert_eq(kvx_ctl_peer_tp_size(-1, -1, 4), 4);
	cr_assert_eq(kvx_ctl_peer_tp_size(0, 2, 4), 2);
	cr_assert_eq(kvx_ctl_peer_tp_size(8, 2, 4), 8);
}
