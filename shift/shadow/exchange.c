/*
 * Spelling of the keys and values SHIFT exchanges through the KV store
 * (see exchange.h). Text, so that `redis-cli` shows what SHIFT agreed on.
 */
#include "shift/shadow/exchange.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void shift_gid_hex(const union ibv_gid *gid, char out[33])
{
	static const char hex[] = "0123456789abcdef";

	for (int i = 0; i < 16; i++) {
		out[2 * i] = hex[gid->raw[i] >> 4];
		out[2 * i + 1] = hex[gid->raw[i] & 15];
	}
	out[32] = '\0';
}

static int gid_parse(const char *s, union ibv_gid *gid)
{
	for (int i = 0; i < 32; i++) {
		char c = s[i];
		int v = c >= '0' && c <= '9' ? c - '0' :
			c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;

		if (v < 0)
			return -EINVAL;
		if (i & 1)
			gid->raw[i / 2] |= (uint8_t)v;
		else
			gid->raw[i / 2] = (uint8_t)(v << 4);
	}
	return 0;
}

static int fit(int n, size_t cap)
{
	return n < 0 || (size_t)n >= cap ? -EMSGSIZE : n;
}

int shift_exchange_qp_key(const struct shift_qp_key *k, char *buf, size_t cap)
{
	char g[33];

	shift_gid_hex(&k->gid, g);
	return fit(snprintf(buf, cap, "qp:{%s}:%u", g, k->qpn), cap);
}

int shift_exchange_mr_key(const union ibv_gid *gid, uint32_t rkey, char *buf,
			  size_t cap)
{
	char g[33];

	shift_gid_hex(gid, g);
	return fit(snprintf(buf, cap, "mr:{%s}:%u", g, rkey), cap);
}

int shift_exchange_mri_key(const union ibv_gid *gid, uint64_t id, unsigned chunk, char *buf,
			   size_t cap)
{
	char g[33];

	shift_gid_hex(gid, g);
	return fit(snprintf(buf, cap, "mri:{%s}:%016llx:%u", g, (unsigned long long)id, chunk),
		   cap);
}

int shift_exchange_qp_encode(const struct shift_qp_value *v, char *buf, size_t cap)
{
	char g[33], pg[33], peer[64] = "", mri[24] = "", mb[48] = "", svc[32] = "";

	shift_gid_hex(&v->gid, g);
	if (v->has_peer) {
		shift_gid_hex(&v->peer.gid, pg);
		snprintf(peer, sizeof(peer), " pgid=%s pqpn=%u", pg, v->peer.qpn);
	}
	if (v->has_mri)
		snprintf(mri, sizeof(mri), " mri=%016llx", (unsigned long long)v->mri);
	if (v->has_mb)
		snprintf(mb, sizeof(mb), " mba=%016llx mbk=%u", (unsigned long long)v->mb_addr,
			 v->mb_rkey);
	if (v->has_svc)
		snprintf(svc, sizeof(svc), " svc=%u dsvc=%u", v->svc, v->dsvc);
	return fit(snprintf(buf, cap, SHIFT_EXCHANGE_VERSION " qp gid=%s qpn=%u psn=%u mtu=%u%s%s%s%s",
			    g, v->qpn, v->psn, v->mtu, peer, mri, mb, svc), cap);
}

int shift_exchange_mr_encode(const struct shift_mr_value *v, char *buf, size_t cap)
{
	if (!v->has_range)
		return fit(snprintf(buf, cap, SHIFT_EXCHANGE_VERSION " mr rkey=%u", v->bk_rkey),
			   cap);
	return fit(snprintf(buf, cap, SHIFT_EXCHANGE_VERSION " mr rkey=%u addr=%llu len=%llu",
			    v->bk_rkey, (unsigned long long)v->addr, (unsigned long long)v->len),
		   cap);
}

/* Parse "name=<decimal>" at *p into *out (bounded by max), advance *p. */
static int field_u64(const char **p, const char *end, const char *name,
		     uint64_t max, uint64_t *out)
{
	size_t n = strlen(name);
	uint64_t v = 0;
	const char *q = *p;

	if ((size_t)(end - q) < n + 2 || memcmp(q, name, n) || q[n] != '=')
		return -EINVAL;
	q += n + 1;
	if (q >= end || *q < '0' || *q > '9')
		return -EINVAL;
	while (q < end && *q >= '0' && *q <= '9') {
		unsigned d = (unsigned)(*q++ - '0');

		if (d > max || v > (max - d) / 10)
			return -EINVAL; /* (above max, without overflowing) */
		v = v * 10 + d;
	}
	if (q < end && *q != ' ')
		return -EINVAL;
	*out = v;
	*p = q < end ? q + 1 : q;
	return 0;
}

static int field_u32(const char **p, const char *end, const char *name,
		     uint32_t max, uint32_t *out)
{
	uint64_t v;
	int rc = field_u64(p, end, name, max, &v);

	if (!rc)
		*out = (uint32_t)v;
	return rc;
}

static int prefix(const char **p, const char *end, const char *want)
{
	size_t n = strlen(want);

	if ((size_t)(end - *p) < n || memcmp(*p, want, n))
		return -EINVAL;
	*p += n;
	return 0;
}

/* Exactly 16 lowercase hex digits at *p, then the end or a space. */
static int field_hex64(const char **p, const char *end, uint64_t *out)
{
	const char *q = *p;
	uint64_t v = 0;

	if (end - q < 16)
		return -EINVAL;
	for (int i = 0; i < 16; i++, q++) {
		int d = *q >= '0' && *q <= '9' ? *q - '0' : *q >= 'a' && *q <= 'f' ? *q - 'a' + 10 : -1;

		if (d < 0)
			return -EINVAL;
		v = v << 4 | (uint64_t)d;
	}
	if (q < end && *q != ' ')
		return -EINVAL;
	*out = v;
	*p = q < end ? q + 1 : q;
	return 0;
}

int shift_exchange_qp_decode(const char *s, size_t len, struct shift_qp_value *v)
{
	const char *p = s, *end = s + len;
	struct shift_qp_value out;

	memset(&out, 0, sizeof(out));
	if (prefix(&p, end, SHIFT_EXCHANGE_VERSION " qp gid=") || end - p < 33 ||
	    gid_parse(p, &out.gid) || p[32] != ' ')
		return -EINVAL;
	p += 33;
	if (field_u32(&p, end, "qpn", 0xffffff, &out.qpn) ||
	    field_u32(&p, end, "psn", 0xffffff, &out.psn) ||
	    field_u32(&p, end, "mtu", IBV_MTU_4096, &out.mtu) ||
	    out.mtu < IBV_MTU_256 || out.qpn == 0)
		return -EINVAL;
	if (p != end && !prefix(&p, end, "pgid=")) {
		if (end - p < 33 || gid_parse(p, &out.peer.gid) || p[32] != ' ')
			return -EINVAL;
		p += 33;
		if (field_u32(&p, end, "pqpn", 0xffffff, &out.peer.qpn) || out.peer.qpn == 0)
			return -EINVAL;
		out.has_peer = true;
	}
	if (p != end && !prefix(&p, end, "mri=")) {
		if (field_hex64(&p, end, &out.mri) || !out.mri)
			return -EINVAL;
		out.has_mri = true;
	}
	if (p != end && !prefix(&p, end, "mba=")) {
		if (field_hex64(&p, end, &out.mb_addr) ||
		    field_u32(&p, end, "mbk", 0xffffffffu, &out.mb_rkey) || !out.mb_addr)
			return -EINVAL;
		out.has_mb = true;
	}
	if (p != end) {
		/* (0: no channel on that NIC) */
		if (field_u32(&p, end, "svc", 0xffffff, &out.svc) ||
		    field_u32(&p, end, "dsvc", 0xffffff, &out.dsvc))
			return -EINVAL;
		out.has_svc = true;
	}
	if (p != end)
		return -EINVAL;
	*v = out;
	return 0;
}

int shift_exchange_mr_decode(const char *s, size_t len, struct shift_mr_value *v)
{
	const char *p = s, *end = s + len;
	struct shift_mr_value out = { 0 };

	if (prefix(&p, end, SHIFT_EXCHANGE_VERSION " mr ") ||
	    field_u32(&p, end, "rkey", 0xffffffffu, &out.bk_rkey))
		return -EINVAL;
	if (p != end) {
		if (field_u64(&p, end, "addr", UINT64_MAX, &out.addr) ||
		    field_u64(&p, end, "len", UINT64_MAX, &out.len) || p != end ||
		    out.len > UINT64_MAX - out.addr)
			return -EINVAL;
		out.has_range = true;
	}
	*v = out;
	return 0;
}

int shift_exchange_ep_key(const struct shift_qp_key *k, char *buf, size_t cap)
{
	char g[33];

	shift_gid_hex(&k->gid, g);
	return fit(snprintf(buf, cap, "ep:{%s}:%u", g, k->qpn), cap);
}

int shift_exchange_poke_key(const union ibv_gid *gid, char *buf, size_t cap)
{
	char g[33];

	shift_gid_hex(gid, g);
	return fit(snprintf(buf, cap, "poke:{%s}", g), cap);
}

int shift_exchange_ep_encode(unsigned gen, unsigned started, char *buf, size_t cap)
{
	return fit(snprintf(buf, cap, SHIFT_EXCHANGE_VERSION " ep gen=%u started=%u", gen, started),
		   cap);
}

int shift_exchange_ep_encode_ex(const struct shift_ep_value *v, char *buf, size_t cap)
{
	char ret[24] = "", seq[20] = "";

	if (v->ret)
		snprintf(ret, sizeof(ret), " ret=%u", v->count);
	if (v->seq)
		snprintf(seq, sizeof(seq), " seq=%u", v->seq);
	return fit(snprintf(buf, cap, SHIFT_EXCHANGE_VERSION " ep gen=%u started=%u%s%s%s%s%s", v->gen,
			    v->started, ret, v->bkfail ? " bkfail=1" : "", v->nosend ? " nosend=1" : "",
			    v->closed ? " closed=1" : "", seq),
		   cap);
}

int shift_exchange_ep_decode_ex(const char *s, size_t len, struct shift_ep_value *v)
{
	const char *p = s, *end = s + len;
	uint32_t g, st, c = 0, b = 0, n = 0, cl = 0, sq = 0;
	bool r = false;

	if (prefix(&p, end, SHIFT_EXCHANGE_VERSION " ep ") ||
	    field_u32(&p, end, "gen", 0x3fff, &g) ||
	    field_u32(&p, end, "started", 0xffffffu, &st))
		return -EINVAL;
	/* optional, in this order */
	if (p != end && !field_u32(&p, end, "ret", 0xffffffffu, &c))
		r = true;
	if (p != end)
		(void)field_u32(&p, end, "bkfail", 1, &b);
	if (p != end)
		(void)field_u32(&p, end, "nosend", 1, &n);
	if (p != end)
		(void)field_u32(&p, end, "closed", 1, &cl);
	if (p != end)
		(void)field_u32(&p, end, "seq", 0xffffffffu, &sq);
	if (p != end)
		return -EINVAL;
	v->gen = g;
	v->started = st;
	v->ret = r;
	v->count = c;
	v->bkfail = b != 0;
	v->nosend = n != 0;
	v->closed = cl != 0;
	v->seq = sq;
	return 0;
}

int shift_exchange_ep_decode(const char *s, size_t len, unsigned *gen, unsigned *started)
{
	struct shift_ep_value v;
	int rc = shift_exchange_ep_decode_ex(s, len, &v);

	if (rc)
		return rc;
	*gen = v.gen;
	*started = v.started;
	return 0;
}

int shift_exchange_mri_encode(const struct shift_mri_chunk *c, char *buf, size_t cap)
{
	int n = snprintf(buf, cap, SHIFT_EXCHANGE_VERSION " mri ver=%llu chunks=%u keys=",
			 (unsigned long long)c->ver, c->chunks);

	if (c->n > SHIFT_MRI_CHUNK_KEYS || c->chunks < 1 || c->chunks > SHIFT_MRI_CHUNKS)
		return -EINVAL;
	for (unsigned i = 0; i < c->n && n >= 0 && (size_t)n < cap; i++)
		n += snprintf(buf + n, cap - (size_t)n, i ? ",%u" : "%u", c->keys[i]);
	return fit(n, cap);
}

/* "shift1 mri ver=<v> chunks=<c> keys=<k>,<k>,..." (keys may be none) */
int shift_exchange_mri_decode(const char *s, size_t len, struct shift_mri_chunk *c)
{
	const char *p = s, *end = s + len;
	uint32_t chunks;

	if (prefix(&p, end, SHIFT_EXCHANGE_VERSION " mri ") ||
	    field_u64(&p, end, "ver", UINT64_MAX, &c->ver) ||
	    field_u32(&p, end, "chunks", SHIFT_MRI_CHUNKS, &chunks) || chunks < 1 ||
	    prefix(&p, end, "keys="))
		return -EINVAL;
	c->chunks = chunks;
	c->n = 0;
	while (p < end) {
		uint64_t v = 0;
		const char *d = p;

		while (p < end && *p >= '0' && *p <= '9' && p - d < 10)
			v = v * 10 + (uint64_t)(*p++ - '0');
		if (p == d || v > UINT32_MAX || c->n == SHIFT_MRI_CHUNK_KEYS ||
		    (p < end && *p != ','))
			return -EINVAL;
		c->keys[c->n++] = (uint32_t)v;
		if (p < end && ++p == end)
			return -EINVAL; /* (a trailing comma) */
	}
	return 0;
}
