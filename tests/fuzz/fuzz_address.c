/* SPDX-License-Identifier: Apache-2.0 */
/* libFuzzer target: zmq_address and request-id parsers (addresses come from the network). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "control_internal.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct kvx_ctl_addr a, b;
	char buf[1024], s[4096];
	if (kvx_ctl_zmq_address_parse((const char *)data, size, &a, NULL, 0) == 0) {
		/* A parsed address formats and parses back to itself, unless the host itself
		 * holds a ',' (MoRIIO's grammar cannot express that). */
		int n = kvx_ctl_zmq_address_format(&a, buf, sizeof(buf));
		if (n <= 0)
			abort();
		if (!strchr(a.host, ',') && !strchr(a.host, ' ') && !strchr(a.host, '\t') &&
		    !strchr(a.host, '\n') && !strchr(a.host, '\r') && !strchr(a.host, '\v') &&
		    !strchr(a.host, '\f')) {
			if (kvx_ctl_zmq_address_parse(buf, (size_t)n, &b, NULL, 0) != 0 ||
			    strcmp(a.host, b.host) || a.handshake_port != b.handshake_port ||
			    a.notify_port != b.notify_port)
				abort();
		}
	}
	if (size >= sizeof(s))
		return 0;
	memcpy(s, data, size);
	s[size] = 0;
	int n = kvx_ctl_reqid_prefill_addr(s, buf, sizeof(buf));
	if (n > 0 && (size_t)n != strlen(buf))
		abort();
	n = kvx_ctl_reqid_decode_addr(s, buf, sizeof(buf));
	if (n > 0 && (size_t)n != strlen(buf))
		abort();
	n = kvx_ctl_reqid_strip_suffix(s, buf, sizeof(buf));
	if (n >= 0 && ((size_t)n != strlen(buf) || (size_t)n > strlen(s)))
		abort();
	return 0;
}
