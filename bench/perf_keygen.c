/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvxfer-perf keygen DIR: create an auth directory for --auth-dir / kvx_engine_params.auth_dir
 * (issue 17): DIR/engine.key_secret (this engine's CURVE key pair, mode 0600), DIR/engine.key
 * (its public key, for the peers) and DIR/allowed/ (the peers' public keys).
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "kvxfer/control.h"
#include "perf.h"

int kvx_perf_keygen_main(int argc, char **argv)
{
	if (argc != 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
		FILE *f = argc == 2 ? stdout : stderr;
		fprintf(f, "usage: kvxfer-perf keygen DIR\n"
			   "  creates DIR/engine.key_secret (CURVE key pair, mode 0600), DIR/engine.key\n"
			   "  (public key) and DIR/allowed/; copy each peer's engine.key into\n"
			   "  DIR/allowed/ (as PEER_HOST.key when this engine dials several peers),\n"
			   "  then pass --auth-dir DIR to trace/notify or set kvx_engine_params.auth_dir\n");
		return argc == 2 ? 0 : 2;
	}
	int rc = kvx_ctl_auth_keygen(argv[1]);
	if (rc) {
		fprintf(stderr, "kvxfer-perf keygen: %s: %s%s\n", argv[1], kvx_strerror(rc),
			rc == -EEXIST ? " (a key pair is there already; it is never overwritten)" : "");
		return 1;
	}
	printf("kvxfer-perf keygen: wrote %s/engine.key_secret (keep private), %s/engine.key "
	       "(give to peers) and %s/allowed/\n", argv[1], argv[1], argv[1]);
	return 0;
}
