/*
 * kv/kv_redis_cluster.c - the Redis backend over a Redis Cluster
 * (redis-cluster:// URLs).  Debian 12's hiredis (0.14) has no cluster
 * client, so the routing is here, after the Redis Cluster specification:
 *
 *  - the slot map (16,384 slots -> the primary serving each) is read with
 *    CLUSTER NODES from any node that answers, the URL's seed nodes and the
 *    primaries already known in turn, at open and again before the next
 *    command after any redirect or connection failure (at most every
 *    KV_CLUSTER_REFRESH_MS);
 *  - each key goes to its slot's primary (kv_cluster_slot: CRC16 of the
 *    key or its {hash tag}); SHIFT's keys carry the publishing host's GID
 *    as their hash tag (shift/shadow/exchange.c), so one host's records
 *    share one slot;
 *  - MOVED updates that slot and retries on the new owner; ASK retries
 *    once on the importing node, after ASKING; TRYAGAIN (a multi-key read
 *    of a slot in migration) retries shortly; at most KV_CLUSTER_HOPS
 *    tries per command, all within the command's one deadline;
 *  - MGET groups its keys by slot (a cluster refuses a multi-slot MGET with
 *    CROSSSLOT) and sends one MGET per slot, all within the deadline.
 *
 * One connection per primary (kv_redis_conn.c: lazy, authenticated, with
 * its own back-off), all under the handle lock.  The map is untrusted
 * input like every reply: bounded (KV_CLUSTER_NODES_REPLY bytes,
 * KV_CLUSTER_NODES_MAX primaries), parsed strictly, refused whole when a
 * line does not parse or a slot is claimed twice; a redirect that does not
 * parse is an error, never a guess.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <hiredis/hiredis.h>

#include "kv/kv.h"
#include "kv/kv_backend.h"
#include "kv/kv_redis_cluster.h"
#include "kv/kv_redis_conn.h"
#include "shift/base/log.h"

#define KV_CLUSTER_HOPS 6          /* tries of one command: redirects included */
#define KV_CLUSTER_REFRESH_MS 100  /* at most one map refresh per this */
#define KV_CLUSTER_TRYAGAIN_MS 10  /* wait before retrying a TRYAGAIN */

struct kv_cluster {
	uint16_t owner[KV_CLUSTER_SLOTS]; /* node index + 1; 0 = not known */
	struct kv_redis **node;           /* seeds first, then what maps name */
	int nnodes, cap;
	int next;             /* the node asked for the map first */
	bool stale;           /* refresh the map before the next command */
	uint64_t refresh_ns;  /* last refresh attempt */
	int primaries;        /* in the last map read, 0 = none yet */
	int served;           /* slots it served */
	char where[300];      /* "redis-cluster://[user@]n1:p1,n2:p2" */
	SSL_CTX *tls_ctx;     /* rediss-cluster://: every node's, NULL else */
};

/* ---- slots ---- */

static uint16_t kv_crc16(const unsigned char *p, size_t n)
{
	uint16_t crc = 0;

	for (size_t i = 0; i < n; i++) {
		crc ^= (uint16_t)(p[i] << 8);
		for (int b = 0; b < 8; b++)
			crc = (uint16_t)(crc & 0x8000 ? (crc << 1) ^ 0x1021 : crc << 1);
	}
	return crc;
}

unsigned kv_cluster_slot(const char *k, size_t len)
{
	const char *o = memchr(k, '{', len);

	if (o) {
		const char *c = memchr(o + 1, '}', len - (size_t)(o + 1 - k));

		if (c && c > o + 1) {
			k = o + 1;
			len = (size_t)(c - k);
		}
	}
	return kv_crc16((const unsigned char *)k, len) & (KV_CLUSTER_SLOTS - 1);
}

/* ---- CLUSTER NODES ---- */

/* Field i (0-based, space-separated) of line [p, e): its start and length. */
static const char *kv_field(const char *p, const char *e, int i, size_t *n)
{
	for (; i > 0 && p < e; i--) {
		const char *sp = memchr(p, ' ', (size_t)(e - p));

		if (!sp)
			return NULL;
		p = sp + 1;
	}
	if (p >= e)
		return NULL;
	const char *sp = memchr(p, ' ', (size_t)(e - p));

	*n = (size_t)((sp ? sp : e) - p);
	return p;
}

static bool kv_has_flag(const char *f, size_t n, const char *flag)
{
	size_t fl = strlen(flag);

	for (const char *p = f; p < f + n;) {
		const char *c = memchr(p, ',', (size_t)(f + n - p));
		size_t l = (size_t)((c ? c : f + n) - p);

		if (l == fl && !memcmp(p, flag, fl))
			return true;
		p += l + 1;
	}
	return false;
}

/* "ip:port@cport[,hostname]" into *a (ip empty: asked's host). */
static int kv_parse_node_addr(const char *f, size_t n, const struct shift_kv_addr *asked,
			      struct shift_kv_addr *a)
{
	const char *at = memchr(f, '@', n), *colon = NULL;
	long port = 0;

	if (!at)
		return -1;
	for (const char *p = f; p < at; p++)
		if (*p == ':')
			colon = p;
	if (!colon || colon + 1 == at || at - colon > 6)
		return -1;
	for (const char *p = colon + 1; p < at; p++) {
		if (*p < '0' || *p > '9')
			return -1;
		port = port * 10 + (*p - '0');
	}
	if (port < 1 || port > 65535 || (size_t)(colon - f) >= sizeof(a->host))
		return -1;
	for (const char *p = f; p < colon; p++)
		if (!((*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'f') ||
		      (*p >= 'A' && *p <= 'F') || *p == '.' || *p == ':'))
			return -1;
	if (colon == f) {
		snprintf(a->host, sizeof(a->host), "%s", asked->host);
	} else {
		memcpy(a->host, f, (size_t)(colon - f));
		a->host[colon - f] = '\0';
	}
	a->port = (int)port;
	return 0;
}

/* "N" or "N-M" (0..16383, N <= M); -1 if not. */
static int kv_parse_range(const char *f, size_t n, int *lo, int *hi)
{
	int v[2] = { -1, -1 }, k = 0;

	for (size_t i = 0; i < n; i++) {
		if (f[i] == '-' && k == 0 && v[0] >= 0) {
			k = 1;
		} else if (f[i] >= '0' && f[i] <= '9' && (v[k] < 0 || v[k] < KV_CLUSTER_SLOTS)) {
			v[k] = (v[k] < 0 ? 0 : v[k] * 10) + (f[i] - '0');
		} else {
			return -1;
		}
	}
	if (k == 0)
		v[1] = v[0];
	if (v[0] < 0 || v[1] < v[0] || v[1] >= KV_CLUSTER_SLOTS)
		return -1;
	*lo = v[0];
	*hi = v[1];
	return 0;
}

/* One primary's line: its slots into owner (as index idx + 1). */
static int kv_parse_slots(const char *p, const char *e, int idx, uint16_t *owner, char *why,
			  size_t whycap)
{
	size_t n;
	const char *f;

	for (int i = 8; (f = kv_field(p, e, i, &n)); i++) {
		int lo, hi;

		if (f[0] == '[')
			continue; /* [slot->-id] / [slot-<-id]: in migration */
		if (kv_parse_range(f, n, &lo, &hi)) {
			snprintf(why, whycap, "bad slot range '%.*s'", (int)(n > 20 ? 20 : n), f);
			return -1;
		}
		for (int s = lo; s <= hi; s++) {
			if (owner[s]) {
				snprintf(why, whycap, "slot %d claimed by two primaries", s);
				return -1;
			}
			owner[s] = (uint16_t)(idx + 1);
		}
	}
	return 0;
}

int kv_cluster_parse_nodes(const char *txt, size_t len, const struct shift_kv_addr *asked,
			   struct shift_kv_addr *addr, int cap, uint16_t *owner, char *why,
			   size_t whycap)
{
	const char *end = txt + len;
	int n = 0, line = 0;

	memset(owner, 0, KV_CLUSTER_SLOTS * sizeof(*owner));
	for (const char *p = txt; p < end; line++) {
		const char *nl = memchr(p, '\n', (size_t)(end - p));
		const char *e = nl ? nl : end, *f;
		size_t fl;

		if (e > p && e[-1] == '\r')
			e--;
		if (e == p) {
			p = nl ? nl + 1 : end;
			continue;
		}
		if (!kv_field(p, e, 7, &fl) || !(f = kv_field(p, e, 2, &fl))) {
			snprintf(why, whycap, "line %d is not a CLUSTER NODES line", line + 1);
			return -1;
		}
		if (kv_has_flag(f, fl, "master") && !kv_has_flag(f, fl, "fail") &&
		    !kv_has_flag(f, fl, "handshake") && !kv_has_flag(f, fl, "noaddr") &&
		    kv_field(p, e, 8, &fl)) {
			if (n == cap) {
				snprintf(why, whycap, "more than %d primaries", cap);
				return -1;
			}
			f = kv_field(p, e, 1, &fl);
			if (kv_parse_node_addr(f, fl, asked, &addr[n])) {
				snprintf(why, whycap, "line %d: bad address", line + 1);
				return -1;
			}
			if (kv_parse_slots(p, e, n, owner, why, whycap))
				return -1;
			n++;
		}
		p = nl ? nl + 1 : end;
	}
	if (!n)
		snprintf(why, whycap, "no primary serves any slot");
	return n ? n : -1;
}

/* ---- nodes and the map ---- */

/* The node with address a (added if new): its index, or -1. */
static int kv_node(shift_kv *h, struct kv_cluster *cl, const struct shift_kv_addr *a)
{
	for (int i = 0; i < cl->nnodes; i++)
		if (cl->node[i]->node.port == a->port && !strcmp(cl->node[i]->node.host, a->host))
			return i;
	if (cl->nnodes == KV_CLUSTER_NODES_MAX + SHIFT_KV_ADDRS_MAX)
		return -1;
	if (cl->nnodes == cl->cap) {
		int cap = cl->cap ? 2 * cl->cap : 16;
		struct kv_redis **nn = realloc(cl->node, (size_t)cap * sizeof(*nn));

		if (!nn)
			return -1;
		cl->node = nn;
		cl->cap = cap;
	}
	struct kv_redis *r = malloc(sizeof(*r));

	if (!r)
		return -1;
	kv_redis_node_init(h, r, a);
	r->tls_ctx = cl->tls_ctx; /* (shared: freed with cl) */
	cl->node[cl->nnodes] = r;
	return cl->nnodes++;
}

/* Take the map one node gave: 0, or -1 with why. */
static int kv_cluster_take(shift_kv *h, struct kv_cluster *cl, const redisReply *rep,
			   const struct shift_kv_addr *asked, char *why, size_t whycap)
{
	struct shift_kv_addr *addr = calloc(KV_CLUSTER_NODES_MAX, sizeof(*addr));
	uint16_t *owner = malloc(KV_CLUSTER_SLOTS * sizeof(*owner));
	int n = -1, idx[KV_CLUSTER_NODES_MAX], served = 0;

	if (!addr || !owner)
		snprintf(why, whycap, "out of memory");
	else if (rep->type != REDIS_REPLY_STRING)
		snprintf(why, whycap, "CLUSTER NODES: %.100s",
			 rep->type == REDIS_REPLY_ERROR ? rep->str : "not a string");
	else
		n = kv_cluster_parse_nodes(rep->str, (size_t)rep->len, asked, addr,
					   KV_CLUSTER_NODES_MAX, owner, why, whycap);
	for (int i = 0; i < n; i++)
		if ((idx[i] = kv_node(h, cl, &addr[i])) < 0) {
			snprintf(why, whycap, "out of memory");
			n = -1;
		}
	for (int s = 0; n > 0 && s < KV_CLUSTER_SLOTS; s++) {
		cl->owner[s] = owner[s] ? (uint16_t)(idx[owner[s] - 1] + 1) : 0;
		served += owner[s] != 0;
	}
	/* once per change of the map's shape, not per refresh */
	if (n > 0 && (n != cl->primaries || served != cl->served))
		shift_info("kv: %s: %d primaries serve %d of the cluster's %d slots", cl->where, n,
			   served, KV_CLUSTER_SLOTS);
	if (n > 0) {
		cl->primaries = n;
		cl->served = served;
	}
	free(addr);
	free(owner);
	return n > 0 ? 0 : -1;
}

/* Read the map from the first node that gives one, before deadline. */
static int kv_cluster_refresh(shift_kv *h, struct kv_cluster *cl, uint64_t deadline)
{
	const char *argv[] = { "CLUSTER", "NODES" };
	char why[200] = "no node to ask", all[480] = "";
	size_t used = 0;
	int nn = cl->nnodes;

	cl->refresh_ns = kv_now_ns();
	for (int i = 0; i < nn && kv_ms_left(deadline) > 0; i++) {
		int k = (cl->next + i) % nn, rc;
		struct kv_redis *r = cl->node[k];
		redisReply *rep = kv_redis_call(h, r, deadline, &rc, 2, argv, KV_CLUSTER_NODES_REPLY);

		if (rep && !kv_cluster_take(h, cl, rep, &r->node, why, sizeof(why))) {
			freeReplyObject(rep);
			cl->next = k;
			cl->stale = false;
			return 0;
		}
		if (rep)
			freeReplyObject(rep);
		else
			snprintf(why, sizeof(why), "%s", shift_kv_last_error());
		if (used < sizeof(all)) {
			int w = snprintf(all + used, sizeof(all) - used, "%s%s:%d: %s", used ? "; " : "",
					 r->node.host, r->node.port, why);

			used += w > 0 ? (size_t)w : 0;
		}
	}
	return kv_err(-ENOTCONN, "%s: no slot map (%s)", cl->where, used ? all : why);
}

/* ---- routing ---- */

enum kv_cop_kind { KV_COP_PUT, KV_COP_GET, KV_COP_DEL, KV_COP_MGET };

/* One command for one slot. */
struct kv_cop {
	enum kv_cop_kind kind;
	const char *const *k;
	const size_t *klen;
	size_t n;
	const void *v;
	size_t vlen;
	uint64_t ttl_ms;
	void **out;
	size_t *outlen;
};

static int kv_cop_run(shift_kv *h, struct kv_redis *r, const struct kv_cop *o, uint64_t dl)
{
	switch (o->kind) {
	case KV_COP_PUT:
		return kv_redis_put_on(h, r, o->k[0], o->klen[0], o->v, o->vlen, o->ttl_ms, dl);
	case KV_COP_GET:
		return kv_redis_get_on(h, r, o->k[0], o->klen[0], o->out, o->outlen, dl);
	case KV_COP_DEL:
		return kv_redis_del_on(h, r, o->k[0], o->klen[0], dl);
	case KV_COP_MGET:
		return kv_redis_mget_on(h, r, o->k, o->klen, o->n, o->out, o->outlen, dl);
	}
	return -EINVAL;
}

/* Run o on the owner of slot, following redirects, before dl. */
static int kv_cluster_route(shift_kv *h, struct kv_cluster *cl, unsigned slot,
			    const struct kv_cop *o, uint64_t dl)
{
	int ask = -1, rc = -ENOTCONN;

	for (int hop = 0; hop < KV_CLUSTER_HOPS; hop++) {
		uint64_t now = kv_now_ns();

		/* (half of what is left at most: the old map still routes) */
		if (cl->stale && now - cl->refresh_ns >= KV_CLUSTER_REFRESH_MS * 1000000ull)
			(void)kv_cluster_refresh(h, cl, dl > now ? now + (dl - now) / 2 : dl);
		int i = ask >= 0 ? ask : cl->owner[slot] ? cl->owner[slot] - 1 : cl->next;
		struct kv_redis *r = cl->node[i];

		r->asking = ask >= 0;
		ask = -1;
		rc = kv_cop_run(h, r, o, dl);
		r->asking = false; /* (not sent if the connect failed: for this command only) */
		if (rc == KV_REDIS_TRYAGAIN) {
			kv_sleep_ms(kv_ms_left(dl) > KV_CLUSTER_TRYAGAIN_MS ? KV_CLUSTER_TRYAGAIN_MS : 0);
			continue;
		}
		if (rc != KV_REDIS_REDIRECT) {
			cl->stale |= rc == -ENOTCONN;
			return rc;
		}
		int to = kv_node(h, cl, &r->redir.to);

		if (to < 0)
			return kv_err(-ENOMEM, "%s: out of memory", cl->where);
		if (r->redir.ask) {
			ask = to;
		} else {
			shift_debug("kv: %s: slot %d moved to %s:%d", cl->where, r->redir.slot,
				    r->redir.to.host, r->redir.to.port);
			cl->owner[r->redir.slot] = (uint16_t)(to + 1);
			cl->stale = true;
		}
	}
	if (rc == KV_REDIS_TRYAGAIN || rc == KV_REDIS_REDIRECT)
		rc = kv_err(-ENOTCONN, "%s: slot %u still redirected after %d tries", cl->where,
			    slot, KV_CLUSTER_HOPS);
	return rc;
}

static int kv_cluster_one(shift_kv *h, struct kv_cop *o, uint64_t dl)
{
	return kv_cluster_route(h, h->priv, kv_cluster_slot(o->k[0], o->klen[0]), o, dl);
}

/* ---- backend operations ---- */

static void kv_cluster_free(struct kv_cluster *cl)
{
	for (int i = 0; i < cl->nnodes; i++) {
		kv_redis_drop(cl->node[i]);
		free(cl->node[i]);
	}
	free(cl->node);
	kv_tls_ctx_free(cl->tls_ctx);
	free(cl);
}

static int kv_cluster_open(shift_kv *h)
{
	struct kv_cluster *cl = calloc(1, sizeof(*cl));
	int rc = 0;

	if (!cl)
		return kv_err(-ENOMEM, "kv redis-cluster: out of memory");
	kv_redis_where_addrs(h, cl->where, sizeof(cl->where),
			     h->url.tls ? "rediss-cluster" : "redis-cluster");
	rc = kv_redis_tls_ctx(h, cl->where, &cl->tls_ctx);
	if (rc) {
		free(cl);
		return rc;
	}
	for (int i = 0; i < h->url.naddrs && !rc; i++)
		if (kv_node(h, cl, &h->url.addr[i]) < 0)
			rc = kv_err(-ENOMEM, "kv redis-cluster: out of memory");
	cl->stale = true;
	if (!rc && !h->opts.lazy_connect)
		rc = kv_cluster_refresh(h, cl, kv_op_deadline(h));
	if (rc) {
		kv_cluster_free(cl);
		return rc;
	}
	h->priv = cl;
	return 0;
}

static void kv_cluster_close(shift_kv *h)
{
	if (h->priv)
		kv_cluster_free(h->priv);
	h->priv = NULL;
}

static int kv_cluster_put(shift_kv *h, const char *k, size_t klen, const void *v, size_t vlen,
			  uint64_t ttl_ms, uint64_t dl)
{
	struct kv_cop o = { .kind = KV_COP_PUT, .k = &k, .klen = &klen, .n = 1,
			    .v = v, .vlen = vlen, .ttl_ms = ttl_ms };

	return kv_cluster_one(h, &o, dl);
}

static int kv_cluster_get(shift_kv *h, const char *k, size_t klen, void **v, size_t *vlen,
			  uint64_t dl)
{
	struct kv_cop o = { .kind = KV_COP_GET, .k = &k, .klen = &klen, .n = 1,
			    .out = v, .outlen = vlen };

	return kv_cluster_one(h, &o, dl);
}

static int kv_cluster_del(shift_kv *h, const char *k, size_t klen, uint64_t dl)
{
	struct kv_cop o = { .kind = KV_COP_DEL, .k = &k, .klen = &klen, .n = 1 };

	return kv_cluster_one(h, &o, dl);
}

/* One MGET per slot, the keys of each slot in their order. */
static int kv_cluster_mget(shift_kv *h, const char *const *k, const size_t *klen, size_t n,
			   void **v, size_t *vlen, uint64_t dl)
{
	unsigned slot[SHIFT_KV_MGET_MAX];
	bool done[SHIFT_KV_MGET_MAX] = { false };
	const char *gk[SHIFT_KV_MGET_MAX];
	size_t gl[SHIFT_KV_MGET_MAX], gi[SHIFT_KV_MGET_MAX], glen[SHIFT_KV_MGET_MAX];
	void *gv[SHIFT_KV_MGET_MAX];
	int rc = 0;

	for (size_t i = 0; i < n; i++)
		slot[i] = kv_cluster_slot(k[i], klen[i]);
	for (size_t i = 0; i < n && !rc; i++) {
		size_t m = 0;

		if (done[i])
			continue;
		for (size_t j = i; j < n; j++)
			if (!done[j] && slot[j] == slot[i]) {
				done[j] = true;
				gi[m] = j, gk[m] = k[j], gl[m] = klen[j];
				gv[m] = NULL, glen[m] = 0;
				m++;
			}
		struct kv_cop o = { .kind = KV_COP_MGET, .k = gk, .klen = gl, .n = m,
				    .out = gv, .outlen = glen };

		rc = kv_cluster_route(h, h->priv, slot[i], &o, dl);
		for (size_t g = 0; g < m; g++) /* on error too: kv.c frees them */
			v[gi[g]] = gv[g], vlen[gi[g]] = glen[g];
	}
	return rc;
}

const struct kv_backend kv_backend_redis_cluster = {
	.name = "redis-cluster",
	.open = kv_cluster_open,
	.close = kv_cluster_close,
	.put = kv_cluster_put,
	.get = kv_cluster_get,
	.mget = kv_cluster_mget,
	.del = kv_cluster_del,
	.wait = NULL, /* kv.c polls GET with bounded sleeps */
};
