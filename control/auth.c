/* SPDX-License-Identifier: Apache-2.0 */
/*
 * CURVE authentication of the control plane (issue 17): the engine's key pair and an allowlist
 * of peer public keys read from an auth directory, CURVE options on the ROUTERs (server) and
 * on every DEALER (client), a ZAP handler that admits only allowlisted client keys, and socket
 * monitors that count every refused connection. The ZAP REP socket and the monitor PAIR sockets
 * are served from the control lcore's poll loop through kvx_ctl_watch_fd(): no extra thread.
 *
 * Auth directory layout (kvx_ctl_auth_keygen() creates it):
 *   DIR/engine.key          this engine's public certificate (give it to peers)
 *   DIR/engine.key_secret   this engine's key pair (mode 0600; exactly one *.key_secret in DIR)
 *   DIR/allowed/NAME.key    public certificates of the peers allowed to connect; when dialling
 *                           host H the server key is allowed/H.key, or the only key there.
 * Files use ZeroMQ's certificate format (zcert): `curve` section, `public-key = "<Z85>"`.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <zmq.h>

#include "ctl_impl.h"

#define AUTH_ALLOWED_MAX 1024
#define ZAP_EP "inproc://zeromq.zap.01"

struct auth_peer {
	char name[KVX_CTL_HOST_MAX + 1];
	uint8_t key[32];
};

struct ctl_auth {
	uint8_t pub[32], sec[32];
	char adir[4096];  /* DIR/allowed */
	struct auth_peer *allowed; /* read at create, again when allowed/ may have changed */
	struct stat seen;          /* allowed/ as stat(2) saw it just before the last read */
	struct timespec read_at;   /* CLOCK_REALTIME of the last read */
	uint32_t nallowed;
	void *zap;        /* REP bound to ZAP_EP (control lcore once started) */
	void *mon[2];     /* PAIR sockets receiving the ROUTERs' handshake-failure events */
	int zap_fd, mon_fd[2];
	int watched;      /* bit 0: zap, bits 1-2: monitors */
};

/* Find `name = "value"` (value 40 Z85 chars) in a zcert file and decode it into 32 bytes. */
static int cert_key(const char *path, const char *name, uint8_t out[32])
{
	FILE *f = fopen(path, "r");
	if (!f)
		return -errno;
	char line[512];
	int rc = -ENOKEY;
	size_t nl = strlen(name);
	while (fgets(line, sizeof(line), f)) {
		char *s = line;
		while (*s == ' ' || *s == '\t')
			s++;
		if (*s == '#' || strncmp(s, name, nl))
			continue;
		s += nl;
		while (*s == ' ' || *s == '\t')
			s++;
		if (*s++ != '=')
			continue;
		while (*s == ' ' || *s == '\t')
			s++;
		if (*s++ != '"')
			continue;
		char *e = strchr(s, '"');
		if (!e || e - s != 40) {
			rc = -EINVAL;
			break;
		}
		*e = 0;
		rc = zmq_z85_decode(out, s) ? 0 : -EINVAL;
		break;
	}
	fclose(f);
	return rc;
}

static int ends_with(const char *s, const char *suf)
{
	size_t a = strlen(s), b = strlen(suf);
	return a > b && !strcmp(s + a - b, suf);
}

static int load_own(struct ctl_auth *a, const char *dir)
{
	DIR *d = opendir(dir);
	if (!d) {
		int e = errno;
		kvx_log(KVX_LOG_ERROR, "control: auth dir %s: %s", dir, strerror(e));
		return -e;
	}
	char path[4096] = "";
	int n = 0;
	struct dirent *de;
	while ((de = readdir(d)))
		if (ends_with(de->d_name, ".key_secret") && n++ == 0)
			snprintf(path, sizeof(path), "%s/%s", dir, de->d_name);
	closedir(d);
	if (n != 1) {
		kvx_log(KVX_LOG_ERROR, "control: auth dir %s must hold exactly one *.key_secret "
			"file (found %d; create one with `kvxfer-perf keygen %s`)", dir, n, dir);
		return -ENOKEY;
	}
	struct stat st;
	if (stat(path, &st) || (st.st_mode & 077)) {
		kvx_log(KVX_LOG_ERROR, "control: %s is readable by group or others; chmod 600 it",
			path);
		return -EPERM;
	}
	int rc = cert_key(path, "secret-key", a->sec);
	rc = rc ? rc : cert_key(path, "public-key", a->pub);
	if (rc)
		kvx_log(KVX_LOG_ERROR, "control: %s: no valid public-key/secret-key (%s)", path,
			strerror(-rc));
	return rc;
}

/* Read DIR/allowed/ (adir) into a new array; *out and *n only on success. Errors logged when
 * @p loud, else left to the caller. */
static int read_allowed(const char *adir, struct auth_peer **out, uint32_t *n, int loud)
{
	DIR *d = opendir(adir);
	if (!d) {
		int e = errno;
		if (loud)
			kvx_log(KVX_LOG_ERROR, "control: auth allowlist %s: %s", adir, strerror(e));
		return -e;
	}
	struct auth_peer *l = calloc(AUTH_ALLOWED_MAX, sizeof(*l));
	if (!l) {
		closedir(d);
		return -ENOMEM;
	}
	uint32_t k = 0;
	int rc = 0;
	struct dirent *de;
	while ((de = readdir(d)) && !rc) {
		if (!ends_with(de->d_name, ".key"))
			continue;
		size_t nl = strlen(de->d_name) - 4;
		if (k == AUTH_ALLOWED_MAX || nl > KVX_CTL_HOST_MAX) {
			if (loud)
				kvx_log(KVX_LOG_ERROR, "control: %s: too many keys or name too long (%s)",
					adir, de->d_name);
			rc = -E2BIG;
			break;
		}
		char path[8192];
		snprintf(path, sizeof(path), "%s/%s", adir, de->d_name);
		struct auth_peer *p = &l[k];
		rc = cert_key(path, "public-key", p->key);
		if (rc) {
			if (loud)
				kvx_log(KVX_LOG_ERROR, "control: %s: no valid public-key (%s)", path,
					strerror(-rc));
			break;
		}
		memcpy(p->name, de->d_name, nl);
		p->name[nl] = 0;
		k++;
	}
	closedir(d);
	if (rc) {
		free(l);
		return rc;
	}
	*out = l;
	*n = k;
	return 0;
}

/* Remember allowed/ as it was just before a read (see auth_stale()). */
static void mark_read(struct ctl_auth *a, const struct stat *st)
{
	a->seen = *st;
	clock_gettime(CLOCK_REALTIME, &a->read_at);
}

static int load_allowed(struct ctl_auth *a, const char *dir)
{
	snprintf(a->adir, sizeof(a->adir), "%s/allowed", dir);
	struct stat st;
	int have = stat(a->adir, &st) == 0;
	int rc = read_allowed(a->adir, &a->allowed, &a->nallowed, 1);
	if (!rc && have)
		mark_read(a, &st);
	if (!rc && !a->nallowed)
		kvx_log(KVX_LOG_WARN, "control: %s holds no *.key: every peer will be refused until one "
			"is added", a->adir);
	return rc;
}

static int ts_eq(const struct timespec *x, const struct timespec *y)
{
	return x->tv_sec == y->tv_sec && x->tv_nsec == y->tv_nsec;
}

/*
 * May allowed/ hold other files than at the last read? Adding, removing or renaming a file
 * changes the directory's mtime (and ctime). Timestamps have a coarse granularity (a kernel tick), so
 * a change made in the same tick as the last read would not show: while the last read happened
 * less than 2 s after the directory's last change, read again each time (as git does with its
 * "racily clean" index entries). One stat(2) per connection otherwise.
 */
static int auth_stale(const struct ctl_auth *a, struct stat *st, int *have)
{
	*have = stat(a->adir, st) == 0;
	if (!*have)
		return 1; /* the read reports and keeps the list */
	const struct stat *o = &a->seen;
	if (st->st_ino != o->st_ino || st->st_dev != o->st_dev || st->st_size != o->st_size ||
	    !ts_eq(&st->st_mtim, &o->st_mtim) || !ts_eq(&st->st_ctim, &o->st_ctim))
		return 1;
	return a->read_at.tv_sec - st->st_mtim.tv_sec < 2; /* entries change the mtime */
}

/*
 * Read allowed/ again when it may have changed, so that a key added to it (or removed from it)
 * takes effect at the next connection without restarting the engine. Called on the creator
 * thread before start and on the control lcore after it (the only readers of the list). A
 * directory that cannot be read keeps the previous list (logged, rate limited).
 */
static void auth_refresh(struct kvx_ctl *ctl, struct ctl_auth *a)
{
	struct auth_peer *l;
	uint32_t n;
	struct stat st;
	int have;
	if (!auth_stale(a, &st, &have))
		return;
	int rc = read_allowed(a->adir, &l, &n, 0);
	if (!rc && have)
		mark_read(a, &st); /* after a failed read, try again at the next connection */
	if (rc) {
		ctl_warn_rl(ctl, "auth: cannot read the allowlist %s again (%s); the %u keys read "
			    "before stay in force", a->adir, strerror(-rc), a->nallowed);
		return;
	}
	if (n != a->nallowed)
		kvx_log(KVX_LOG_INFO, "control: auth allowlist %s now holds %u keys (was %u)", a->adir,
			n, a->nallowed);
	free(a->allowed);
	a->allowed = l;
	a->nallowed = n;
}

int ctl_auth_load(struct kvx_ctl *ctl, const char *dir)
{
	if (!zmq_has("curve")) {
		kvx_log(KVX_LOG_ERROR, "control: auth_dir given but this libzmq has no CURVE");
		return -ENOTSUP;
	}
	struct ctl_auth *a = calloc(1, sizeof(*a));
	if (!a)
		return -ENOMEM;
	a->zap_fd = a->mon_fd[0] = a->mon_fd[1] = -1;
	int rc = load_own(a, dir);
	rc = rc ? rc : load_allowed(a, dir);
	if (rc) {
		free(a->allowed);
		free(a);
		return rc;
	}
	ctl->auth = a;
	return 0;
}

void ctl_auth_free(struct kvx_ctl *ctl)
{
	if (!ctl->auth)
		return;
	free(ctl->auth->allowed);
	explicit_bzero(ctl->auth->sec, sizeof(ctl->auth->sec));
	free(ctl->auth);
	ctl->auth = NULL;
}

int ctl_auth_server(struct kvx_ctl *ctl, void *sock)
{
	struct ctl_auth *a = ctl->auth;
	if (!a)
		return 0;
	int one = 1;
	if (zmq_setsockopt(sock, ZMQ_CURVE_SERVER, &one, sizeof(one)) ||
	    zmq_setsockopt(sock, ZMQ_CURVE_SECRETKEY, a->sec, 32) ||
	    zmq_setsockopt(sock, ZMQ_ZAP_DOMAIN, "kvxfer", 6))
		return -zmq_errno();
	return 0;
}

int ctl_auth_client(struct kvx_ctl *ctl, void *sock, const char *host)
{
	struct ctl_auth *a = ctl->auth;
	if (!a)
		return 0;
	auth_refresh(ctl, a);
	const struct auth_peer *srv = NULL;
	for (uint32_t i = 0; i < a->nallowed && !srv; i++)
		if (!strcmp(a->allowed[i].name, host))
			srv = &a->allowed[i];
	if (!srv && a->nallowed == 1)
		srv = &a->allowed[0];
	if (!srv) {
		ctl_warn_rl(ctl, "auth: no public key for %s (add allowed/%s.key)", host, host);
		return -ENOKEY;
	}
	if (zmq_setsockopt(sock, ZMQ_CURVE_SERVERKEY, srv->key, 32) ||
	    zmq_setsockopt(sock, ZMQ_CURVE_PUBLICKEY, a->pub, 32) ||
	    zmq_setsockopt(sock, ZMQ_CURVE_SECRETKEY, a->sec, 32))
		return -zmq_errno();
	return 0;
}

/* ---------------------------------------------------------------------------------------- */
/* ZAP handler and monitors (control lcore)                                                  */
/* ---------------------------------------------------------------------------------------- */

#define ZAP_FRAMES 8

static void zap_reply(void *s, const zmq_msg_t *rid, const char *code, const char *text,
		      const char *user)
{
	zmq_send(s, "1.0", 3, ZMQ_SNDMORE | ZMQ_DONTWAIT);
	zmq_send(s, zmq_msg_data((zmq_msg_t *)rid), zmq_msg_size((zmq_msg_t *)rid),
		 ZMQ_SNDMORE | ZMQ_DONTWAIT);
	zmq_send(s, code, strlen(code), ZMQ_SNDMORE | ZMQ_DONTWAIT);
	zmq_send(s, text, strlen(text), ZMQ_SNDMORE | ZMQ_DONTWAIT);
	zmq_send(s, user, strlen(user), ZMQ_SNDMORE | ZMQ_DONTWAIT);
	zmq_send(s, "", 0, ZMQ_DONTWAIT);
}

/* One ZAP request (RFC 27): version, request id, domain, address, identity, mechanism,
 * credentials... Returns 0 when nothing was pending. */
static int zap_one(struct kvx_ctl *ctl, struct ctl_auth *a)
{
	zmq_msg_t f[ZAP_FRAMES];
	int n = 0, more = 1;
	while (more) {
		zmq_msg_t m;
		zmq_msg_init(&m);
		if (zmq_msg_recv(&m, a->zap, ZMQ_DONTWAIT) < 0) {
			zmq_msg_close(&m);
			if (n == 0)
				return 0;
			break;
		}
		more = zmq_msg_more(&m);
		if (n < ZAP_FRAMES)
			f[n++] = m;
		else
			zmq_msg_close(&m);
	}
	char addr[64] = "unknown";
	const struct auth_peer *ok = NULL;
	if (n >= 4) {
		size_t l = zmq_msg_size(&f[3]);
		if (l > 0 && l < sizeof(addr)) {
			memcpy(addr, zmq_msg_data(&f[3]), l);
			addr[l] = 0;
		}
	}
	if (n >= 2)
		auth_refresh(ctl, a);
	int curve = n >= 7 && zmq_msg_size(&f[5]) == 5 && !memcmp(zmq_msg_data(&f[5]), "CURVE", 5) &&
		    zmq_msg_size(&f[6]) == 32;
	for (uint32_t i = 0; curve && i < a->nallowed && !ok; i++)
		if (!memcmp(zmq_msg_data(&f[6]), a->allowed[i].key, 32))
			ok = &a->allowed[i];
	if (n >= 2) {
		if (ok) {
			zap_reply(a->zap, &f[1], "200", "OK", ok->name);
			CINC(ctl, auth_accepted);
		} else {
			zap_reply(a->zap, &f[1], "400", "key not allowed", "");
			struct peer_stat *ps = ctl_peer_of(ctl, addr);
			/* Log a peer's first refusal (rate limited); count all of them. */
			if (atomic_fetch_add_explicit(&ps->refused, 1, memory_order_relaxed) == 0) {
				char z[41] = "?";
				if (curve)
					zmq_z85_encode(z, zmq_msg_data(&f[6]), 32);
				ctl_warn_rl(ctl, "auth: refused %s: public key %s is not in allowed/",
					    addr, z);
			}
		}
	}
	for (int i = 0; i < n; i++)
		zmq_msg_close(&f[i]);
	return 1;
}

static void zap_cb(void *arg)
{
	struct kvx_ctl *ctl = arg;
	while (zap_one(ctl, ctl->auth))
		;
}

/* Monitor events: frame 1 = u16 event + u32 value, frame 2 = endpoint. */
static void mon_drain(struct kvx_ctl *ctl, void *s, const char *what)
{
	while (1) {
		zmq_msg_t ev, ep;
		zmq_msg_init(&ev);
		if (zmq_msg_recv(&ev, s, ZMQ_DONTWAIT) < 0) {
			zmq_msg_close(&ev);
			return;
		}
		uint16_t e = 0;
		if (zmq_msg_size(&ev) >= 2)
			memcpy(&e, zmq_msg_data(&ev), 2);
		zmq_msg_init(&ep);
		if (zmq_msg_more(&ev))
			zmq_msg_recv(&ep, s, ZMQ_DONTWAIT);
		zmq_msg_close(&ev);
		zmq_msg_close(&ep);
		uint64_t k = atomic_fetch_add_explicit(&ctl->c.auth_refused, 1,
						       memory_order_relaxed);
		if (e != ZMQ_EVENT_HANDSHAKE_FAILED_AUTH)
			ctl_warn_rl(ctl, "auth: refused a connection on the %s port that did not "
				    "complete a CURVE handshake (%llu refused so far)", what,
				    (unsigned long long)k + 1);
	}
}

static void mon_hs_cb(void *arg)
{
	struct kvx_ctl *ctl = arg;
	mon_drain(ctl, ctl->auth->mon[0], "handshake");
}

static void mon_nt_cb(void *arg)
{
	struct kvx_ctl *ctl = arg;
	mon_drain(ctl, ctl->auth->mon[1], "notify");
}

static int sock_fd(void *s)
{
	int fd = -1;
	size_t l = sizeof(fd);
	return zmq_getsockopt(s, ZMQ_FD, &fd, &l) ? -1 : fd;
}

int ctl_auth_zap_bind(struct kvx_ctl *ctl)
{
	struct ctl_auth *a = ctl->auth;
	if (!a)
		return 0;
	a->zap = zmq_socket(ctl->zctx, ZMQ_REP);
	int zero = 0;
	if (!a->zap || zmq_setsockopt(a->zap, ZMQ_LINGER, &zero, sizeof(zero)) ||
	    zmq_bind(a->zap, ZAP_EP)) {
		kvx_log(KVX_LOG_ERROR, "control: cannot bind the ZAP handler: %s",
			zmq_strerror(zmq_errno()));
		return -EADDRINUSE;
	}
	a->zap_fd = sock_fd(a->zap);
	return 0;
}

int ctl_auth_monitor(struct kvx_ctl *ctl)
{
	struct ctl_auth *a = ctl->auth;
	if (!a)
		return 0;
	void *r[2] = {ctl->hs_router, ctl->nt_router};
	for (int i = 0; i < 2; i++) {
		char ep[64];
		snprintf(ep, sizeof(ep), "inproc://kvx-auth-mon-%d", i);
		int ev = ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL | ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL |
			 ZMQ_EVENT_HANDSHAKE_FAILED_AUTH;
		if (zmq_socket_monitor(r[i], ep, ev))
			return -zmq_errno();
		a->mon[i] = zmq_socket(ctl->zctx, ZMQ_PAIR);
		int zero = 0;
		if (!a->mon[i] || zmq_setsockopt(a->mon[i], ZMQ_LINGER, &zero, sizeof(zero)) ||
		    zmq_connect(a->mon[i], ep))
			return -zmq_errno();
		a->mon_fd[i] = sock_fd(a->mon[i]);
	}
	/* A new pipe's reader counts as awake until one read fails, so its first message would
	 * not signal ZMQ_FD: drain once (EAGAIN, or early events) before the loop waits on it. */
	mon_drain(ctl, a->mon[0], "handshake");
	mon_drain(ctl, a->mon[1], "notify");
	zap_cb(ctl);
	int rc = kvx_ctl_watch_fd(ctl, a->zap_fd, zap_cb, ctl);
	a->watched |= rc ? 0 : 1;
	rc = rc ? rc : kvx_ctl_watch_fd(ctl, a->mon_fd[0], mon_hs_cb, ctl);
	a->watched |= rc ? 0 : 2;
	rc = rc ? rc : kvx_ctl_watch_fd(ctl, a->mon_fd[1], mon_nt_cb, ctl);
	a->watched |= rc ? 0 : 4;
	return rc;
}

void ctl_auth_close(struct kvx_ctl *ctl)
{
	struct ctl_auth *a = ctl->auth;
	if (!a)
		return;
	if (a->watched & 1)
		kvx_ctl_unwatch_fd(ctl, a->zap_fd);
	if (a->watched & 2)
		kvx_ctl_unwatch_fd(ctl, a->mon_fd[0]);
	if (a->watched & 4)
		kvx_ctl_unwatch_fd(ctl, a->mon_fd[1]);
	a->watched = 0;
	for (int i = 0; i < 2; i++) {
		if (a->mon[i])
			zmq_close(a->mon[i]);
		a->mon[i] = NULL;
	}
	if (a->zap)
		zmq_close(a->zap);
	a->zap = NULL;
}

int ctl_auth_on(const struct kvx_ctl *ctl)
{
	return ctl->auth != NULL;
}

/* ---------------------------------------------------------------------------------------- */
/* Key generation                                                                            */
/* ---------------------------------------------------------------------------------------- */

static int write_cert(const char *path, mode_t mode, const char *pub, const char *sec)
{
	FILE *f = NULL;
	int fd = open(path, O_WRONLY | O_CREAT | O_EXCL, mode);
	if (fd < 0 || !(f = fdopen(fd, "w"))) {
		int e = errno;
		if (fd >= 0)
			close(fd);
		kvx_log(KVX_LOG_ERROR, "control: cannot create %s: %s", path, strerror(e));
		return -e;
	}
	time_t t = time(NULL);
	char ts[64];
	strftime(ts, sizeof(ts), "%Y-%m-%d %H:%M:%S", gmtime(&t));
	fprintf(f, "#   ****  Generated on %s UTC by kvxfer  ****\n", ts);
	if (sec)
		fprintf(f, "#   ZeroMQ CURVE **Secret** Certificate\n"
			   "#   Keep it private: it authenticates this engine to its peers.\n");
	else
		fprintf(f, "#   ZeroMQ CURVE Public Certificate\n"
			   "#   Copy it into the allowed/ directory of each peer engine.\n");
	fprintf(f, "\nmetadata\ncurve\n    public-key = \"%s\"\n", pub);
	if (sec)
		fprintf(f, "    secret-key = \"%s\"\n", sec);
	int rc = ferror(f) ? -EIO : 0;
	if (fclose(f) && !rc)
		rc = -errno;
	return rc;
}

int kvx_ctl_auth_keygen(const char *dir)
{
	if (!dir || !dir[0] || strlen(dir) > 4000)
		return -EINVAL;
	if (!zmq_has("curve"))
		return -ENOTSUP;
	char p[4096 + 32];
	if (mkdir(dir, 0700) && errno != EEXIST)
		return -errno;
	snprintf(p, sizeof(p), "%s/allowed", dir);
	if (mkdir(p, 0700) && errno != EEXIST)
		return -errno;
	char pub[41], sec[41];
	if (zmq_curve_keypair(pub, sec))
		return -zmq_errno();
	snprintf(p, sizeof(p), "%s/engine.key_secret", dir);
	int rc = write_cert(p, 0600, pub, sec);
	snprintf(p, sizeof(p), "%s/engine.key", dir);
	rc = rc ? rc : write_cert(p, 0644, pub, NULL);
	explicit_bzero(sec, sizeof(sec));
	return rc;
}

/* ---------------------------------------------------------------------------------------- */
/* The same directory for channels that are not ZMQ sockets (kvxfer-perf bw/lat)             */
/* ---------------------------------------------------------------------------------------- */

int kvx_ctl_auth_keypair(const char *dir, uint8_t pub[32], uint8_t sec[32])
{
	if (!dir || !dir[0] || strlen(dir) > 4000 || !pub || !sec)
		return -EINVAL;
	struct ctl_auth a = {0};
	int rc = load_own(&a, dir);
	if (!rc) {
		memcpy(pub, a.pub, 32);
		memcpy(sec, a.sec, 32);
	}
	explicit_bzero(a.sec, sizeof(a.sec));
	return rc;
}

int kvx_ctl_auth_allowed(const char *dir, const uint8_t key[32], char *name, size_t len)
{
	if (!dir || !dir[0] || strlen(dir) > 4000 || !key)
		return -EINVAL;
	char adir[4096];
	snprintf(adir, sizeof(adir), "%s/allowed", dir);
	struct auth_peer *l;
	uint32_t n;
	int rc = read_allowed(adir, &l, &n, 1);
	if (rc)
		return rc;
	rc = -EACCES;
	for (uint32_t i = 0; i < n && rc; i++)
		if (!memcmp(l[i].key, key, 32)) {
			if (name && len)
				snprintf(name, len, "%s", l[i].name);
			rc = 0;
		}
	free(l);
	return rc;
}
