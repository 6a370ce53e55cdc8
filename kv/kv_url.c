/*
 * kv/kv_url.c - strict parsing of kv store URLs and namespaces.
 *
 *   redis://[user:password@]host[:port][/db]   (also redis://:password@...)
 *   rediss://...                               (the same over TLS, kv_tls.c)
 *   redis-sentinel://[user:password@]s1[:port][,s2[:port]...]/MASTER[/db]
 *       (sentinel port 26379 when omitted; at most SHIFT_KV_ADDRS_MAX;
 *       the credentials are the primary's)
 *   redis-cluster://[user:password@]n1[:port][,n2[:port]...][/]
 *       (seed nodes of a Redis Cluster, port 6379 when omitted; at most
 *       SHIFT_KV_ADDRS_MAX; db 0 only, the one a cluster has)
 *   rediss-sentinel://..., rediss-cluster://...
 *       (the same over TLS: to the sentinels and the primary, to every
 *       cluster node)
 *   mem://NAME
 *
 * Anything not matching exactly (unknown scheme, stray characters, query
 * strings, spaces, out-of-range numbers) is rejected with -EINVAL and a
 * message naming the problem; the password never appears in messages.
 */
#include <errno.h>
#include <string.h>

#include "kv/kv.h"
#include "kv/kv_backend.h"

static bool kv_name_char(char c)
{
	return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
	       (c >= '0' && c <= '9') || c == '_' || c == '.' || c == '-';
}

/* 0 if s[0..len) is 1..max characters of [A-Za-z0-9_.-]. */
static int kv_check_name(const char *s, size_t len, size_t max)
{
	if (len == 0 || len > max)
		return -EINVAL;
	for (size_t i = 0; i < len; i++)
		if (!kv_name_char(s[i]))
			return -EINVAL;
	return 0;
}

int shift_kv_validate_namespace(const char *ns)
{
	if (!ns)
		return kv_err(-EINVAL, "kv namespace is NULL");
	if (kv_check_name(ns, strlen(ns), SHIFT_KV_NS_MAX))
		return kv_err(-EINVAL,
			      "kv namespace '%.80s' invalid: need 1..%d of [A-Za-z0-9_.-]",
			      ns, SHIFT_KV_NS_MAX);
	return 0;
}

static int kv_hexval(char c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	if (c >= 'A' && c <= 'F')
		return c - 'A' + 10;
	return -1;
}

/* Percent-decode s[0..len) into out (capacity cap incl. NUL).  Rejects bad
 * escapes, %00, control characters and overflow. */
static int kv_pct_decode(const char *s, size_t len, char *out, size_t cap,
			 const char *what)
{
	size_t o = 0;

	for (size_t i = 0; i < len; i++) {
		unsigned char c = (unsigned char)s[i];

		if (c == '%') {
			int hi, lo;

			if (i + 2 >= len)
				return kv_err(-EINVAL, "kv URL: truncated %%-escape in %s", what);
			hi = kv_hexval(s[i + 1]);
			lo = kv_hexval(s[i + 2]);
			if (hi < 0 || lo < 0 || (hi == 0 && lo == 0))
				return kv_err(-EINVAL, "kv URL: bad %%-escape in %s", what);
			c = (unsigned char)(hi * 16 + lo);
			i += 2;
		} else if (c <= 0x20 || c == 0x7f) {
			return kv_err(-EINVAL, "kv URL: space or control character in %s", what);
		}
		if (o + 1 >= cap)
			return kv_err(-EINVAL, "kv URL: %s too long", what);
		out[o++] = (char)c;
	}
	out[o] = '\0';
	return 0;
}

/* Parse decimal s[0..len) into [min,max]; no sign, no leading '+', 1..6
 * digits. */
static int kv_parse_uint(const char *s, size_t len, int min, int max, int *out)
{
	long v = 0;

	if (len == 0 || len > 6)
		return -EINVAL;
	for (size_t i = 0; i < len; i++) {
		if (s[i] < '0' || s[i] > '9')
			return -EINVAL;
		v = v * 10 + (s[i] - '0');
	}
	if (v < min || v > max)
		return -EINVAL;
	*out = (int)v;
	return 0;
}

static bool kv_host_char(char c)
{
	return kv_name_char(c);
}

/* Userinfo of the redis URL p..end, decoded into u->user and u->password;
 * *host receives where the host starts.  Userinfo ends at the last '@':
 * host, port and db cannot hold one, so a password may contain '@' or '/'
 * unescaped. */
static int kv_parse_userinfo(const char *p, const char *end,
			     struct shift_kv_url *u, const char **host)
{
	const char *at = NULL, *colon;
	int rc;

	*host = p;
	for (const char *q = p; q < end; q++)
		if (*q == '@')
			at = q;
	if (!at)
		return 0;
	colon = memchr(p, ':', (size_t)(at - p));
	if (!colon)
		return kv_err(-EINVAL,
			      "kv URL: credentials must be 'user:password@' or ':password@'");
	rc = kv_pct_decode(p, (size_t)(colon - p), u->user, sizeof(u->user),
			   "user");
	if (rc)
		return rc;
	rc = kv_pct_decode(colon + 1, (size_t)(at - colon - 1), u->password,
			   sizeof(u->password), "password");
	if (rc)
		return rc;
	if (!u->password[0])
		return kv_err(-EINVAL, "kv URL: empty password");
	*host = at + 1;
	return 0;
}

/* "[IPv6]" or "[IPv6]:port" in hp..hend into u->host; *port receives where
 * the port starts, if there is one. */
static int kv_parse_ipv6_host(const char *hp, const char *hend,
			      struct shift_kv_url *u, const char **port)
{
	const char *rb = memchr(hp, ']', (size_t)(hend - hp));
	size_t n;

	if (!rb)
		return kv_err(-EINVAL, "kv URL: unterminated '[' in host");
	n = (size_t)(rb - hp - 1);
	if (n == 0 || n >= sizeof(u->host))
		return kv_err(-EINVAL, "kv URL: bad IPv6 host");
	for (size_t i = 0; i < n; i++) {
		char c = hp[1 + i];

		if (!(kv_hexval(c) >= 0 || c == ':' || c == '.'))
			return kv_err(-EINVAL, "kv URL: bad IPv6 host");
	}
	memcpy(u->host, hp + 1, n);
	u->host[n] = '\0';
	if (rb + 1 < hend) {
		if (rb[1] != ':')
			return kv_err(-EINVAL, "kv URL: junk after ']'");
		*port = rb + 2;
	}
	return 0;
}

/* "name" or "name:port" in hp..hend into u->host; *port receives where the
 * port starts, if there is one. */
static int kv_parse_name_host(const char *hp, const char *hend,
			      struct shift_kv_url *u, const char **port)
{
	const char *colon = memchr(hp, ':', (size_t)(hend - hp));
	const char *he = colon ? colon : hend;
	size_t n = (size_t)(he - hp);

	if (n == 0)
		return kv_err(-EINVAL, "kv URL: missing host");
	if (n >= sizeof(u->host))
		return kv_err(-EINVAL, "kv URL: host too long");
	for (size_t i = 0; i < n; i++)
		if (!kv_host_char(hp[i]))
			return kv_err(-EINVAL,
				      "kv URL: bad character '%c' in host",
				      hp[i] > 0x20 && hp[i] < 0x7f ? hp[i] : '?');
	memcpy(u->host, hp, n);
	u->host[n] = '\0';
	if (colon)
		*port = colon + 1;
	return 0;
}

/* "host", "host:port", "[IPv6]" or "[IPv6]:port" in hp..hend into u->host
 * and *port (defport when the port is omitted). */
static int kv_parse_addr(const char *hp, const char *hend,
			 struct shift_kv_url *u, int defport, int *port)
{
	const char *pp = NULL;
	int rc;

	if (hp < hend && *hp == '[')
		rc = kv_parse_ipv6_host(hp, hend, u, &pp);
	else
		rc = kv_parse_name_host(hp, hend, u, &pp);
	if (rc)
		return rc;
	*port = defport;
	if (pp && kv_parse_uint(pp, (size_t)(hend - pp), 1, 65535, port))
		return kv_err(-EINVAL, "kv URL: port must be 1..65535");
	return 0;
}

/* "/db" (s..end, s at the '/', or s == end): the database number. */
static int kv_parse_db(const char *s, const char *end, struct shift_kv_url *u)
{
	u->db = 0;
	if (s < end && s + 1 < end &&
	    kv_parse_uint(s + 1, (size_t)(end - s - 1), 0, 65535, &u->db))
		return kv_err(-EINVAL, "kv URL: database must be a number 0..65535");
	return 0;
}

/* The part of a redis URL after "redis://": [userinfo@]host[:port][/db]. */
static int kv_parse_redis(const char *p, struct shift_kv_url *u)
{
	const char *end = p + strlen(p);
	const char *hp, *slash, *hend;
	int rc;

	rc = kv_parse_userinfo(p, end, u, &hp);
	if (rc)
		return rc;
	slash = strchr(hp, '/');
	hend = slash ? slash : end;
	rc = kv_parse_addr(hp, hend, u, 6379, &u->port);
	if (rc)
		return rc;
	return kv_parse_db(slash ? slash : end, end, u);
}

/* The servers "h1[:p1],h2[:p2],..." in hp..hend into u->addr (port
 * defport when omitted). */
static int kv_parse_addrs(const char *hp, const char *hend, int defport,
			  struct shift_kv_url *u)
{
	while (hp <= hend) {
		const char *comma = memchr(hp, ',', (size_t)(hend - hp));
		const char *ae = comma ? comma : hend;
		struct shift_kv_addr *a;
		int rc;

		if (u->naddrs == SHIFT_KV_ADDRS_MAX)
			return kv_err(-EINVAL, "kv URL: more than %d servers",
				      SHIFT_KV_ADDRS_MAX);
		a = &u->addr[u->naddrs];
		rc = kv_parse_addr(hp, ae, u, defport, &a->port);
		if (rc)
			return rc;
		memcpy(a->host, u->host, sizeof(a->host));
		u->naddrs++;
		if (!comma)
			break;
		hp = comma + 1;
	}
	u->host[0] = '\0';
	u->port = 0;
	return 0;
}

/* After "redis-sentinel://": [userinfo@]s1[:p1][,s2[:p2]...]/master[/db].
 * The credentials are the primary's (sentinels without a password). */
static int kv_parse_sentinel(const char *p, struct shift_kv_url *u)
{
	const char *end = p + strlen(p);
	const char *hp, *slash, *mend;
	int rc;

	rc = kv_parse_userinfo(p, end, u, &hp);
	if (rc)
		return rc;
	slash = strchr(hp, '/');
	if (!slash)
		return kv_err(-EINVAL,
			      "kv URL: redis-sentinel:// needs /MASTER after the sentinels");
	rc = kv_parse_addrs(hp, slash, 26379, u);
	if (rc)
		return rc;
	mend = strchr(slash + 1, '/');
	if (!mend)
		mend = end;
	if (kv_check_name(slash + 1, (size_t)(mend - slash - 1), SHIFT_KV_MASTER_MAX))
		return kv_err(-EINVAL,
			      "kv URL: sentinel master name needs 1..%d of [A-Za-z0-9_.-]",
			      SHIFT_KV_MASTER_MAX);
	memcpy(u->master, slash + 1, (size_t)(mend - slash - 1));
	u->master[mend - slash - 1] = '\0';
	return kv_parse_db(mend, end, u);
}

/* After "redis-cluster://": [userinfo@]n1[:p1][,n2[:p2]...] and at most
 * a trailing "/" (a cluster has db 0 only). */
static int kv_parse_cluster(const char *p, struct shift_kv_url *u)
{
	const char *end = p + strlen(p);
	const char *hp, *slash;
	int rc;

	rc = kv_parse_userinfo(p, end, u, &hp);
	if (rc)
		return rc;
	slash = strchr(hp, '/');
	if (slash && slash + 1 != end)
		return kv_err(-EINVAL,
			      "kv URL: redis-cluster:// takes no db (a cluster has db 0 only)");
	return kv_parse_addrs(hp, slash ? slash : end, 6379, u);
}

int shift_kv_url_parse(const char *url, struct shift_kv_url *out)
{
	struct shift_kv_url u;
	size_t len;
	int rc;

	if (!out)
		return kv_err(-EINVAL, "kv URL: NULL output");
	if (!url || !*url)
		url = SHIFT_KV_DEFAULT_URL;
	len = strnlen(url, SHIFT_KV_URL_MAX + 1);
	if (len > SHIFT_KV_URL_MAX)
		return kv_err(-EINVAL, "kv URL longer than %d characters",
			      SHIFT_KV_URL_MAX);
	memset(&u, 0, sizeof(u));
	if (!strncmp(url, "redis://", 8)) {
		u.scheme = SHIFT_KV_SCHEME_REDIS;
		rc = kv_parse_redis(url + 8, &u);
	} else if (!strncmp(url, "rediss://", 9)) {
		u.scheme = SHIFT_KV_SCHEME_REDIS;
		u.tls = true;
		rc = kv_parse_redis(url + 9, &u);
	} else if (!strncmp(url, "redis-sentinel://", 17)) {
		u.scheme = SHIFT_KV_SCHEME_SENTINEL;
		rc = kv_parse_sentinel(url + 17, &u);
	} else if (!strncmp(url, "rediss-sentinel://", 18)) {
		u.scheme = SHIFT_KV_SCHEME_SENTINEL;
		u.tls = true;
		rc = kv_parse_sentinel(url + 18, &u);
	} else if (!strncmp(url, "redis-cluster://", 16)) {
		u.scheme = SHIFT_KV_SCHEME_CLUSTER;
		rc = kv_parse_cluster(url + 16, &u);
	} else if (!strncmp(url, "rediss-cluster://", 17)) {
		u.scheme = SHIFT_KV_SCHEME_CLUSTER;
		u.tls = true;
		rc = kv_parse_cluster(url + 17, &u);
	} else if (!strncmp(url, "mem://", 6)) {
		u.scheme = SHIFT_KV_SCHEME_MEM;
		rc = kv_check_name(url + 6, len - 6, SHIFT_KV_MEM_NAME_MAX);
		if (rc)
			rc = kv_err(-EINVAL,
				    "kv URL: mem://NAME needs 1..%d of [A-Za-z0-9_.-]",
				    SHIFT_KV_MEM_NAME_MAX);
		else
			memcpy(u.name, url + 6, len - 6 + 1);
	} else {
		rc = kv_err(-EINVAL,
			    "kv URL must start with redis://, rediss://, redis-sentinel://, "
			    "rediss-sentinel://, redis-cluster://, rediss-cluster:// or mem://");
	}
	if (rc)
		return rc;
	*out = u;
	return 0;
}
