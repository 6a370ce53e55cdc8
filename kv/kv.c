/*
 * kv/kv.c - front end of the kv layer: handle lifetime, argument checks,
 * namespacing ("shift:<ns>:<key>"), the handle lock, the list of keys a
 * handle owns, the polling wait() for backends without a native one, and
 * the thread-local last-error message.  Backends live in kv_redis.c and
 * kv_mem.c behind struct kv_backend.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kv/kv.h"
#include "kv/kv_backend.h"
#include "shift/base/config.h"

static _Thread_local char kv_errbuf[320];

int kv_err(int rc, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(kv_errbuf, sizeof(kv_errbuf), fmt, ap);
	va_end(ap);
	return rc;
}

const char *shift_kv_last_error(void)
{
	return kv_errbuf[0] ? kv_errbuf : "no error";
}

const char *shift_kv_strerror(int rc)
{
	switch (rc) {
	case 0: return "success";
	case -EINVAL: return "invalid argument";
	case -ENAMETOOLONG: return "key too long";
	case -EMSGSIZE: return "value too large for buffer or limit";
	case -ENOENT: return "no such key";
	case -ETIMEDOUT: return "timed out waiting for key";
	case -ENOTCONN: return "kv store unreachable";
	case -EACCES: return "kv store refused authentication";
	case -EPROTO: return "kv store returned an error";
	case -ENOMEM: return "out of memory";
	default: return rc >= 0 ? "success" : "unknown kv error";
	}
}

uint64_t kv_now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

int kv_ms_left(uint64_t deadline_ns)
{
	uint64_t now = kv_now_ns();
	uint64_t left;

	if (now >= deadline_ns)
		return 0;
	left = (deadline_ns - now + 999999) / 1000000;
	return left > 0x7fffffff ? 0x7fffffff : (int)left;
}

void kv_sleep_ms(int ms)
{
	struct timespec ts = { .tv_sec = ms / 1000,
			       .tv_nsec = (long)(ms % 1000) * 1000000L };

	while (ms > 0 && nanosleep(&ts, &ts) == -1 && errno == EINTR)
		;
}

void *kv_dup_value(const void *v, size_t len)
{
	char *p = malloc(len + 1);

	if (!p)
		return NULL;
	if (len)
		memcpy(p, v, len);
	p[len] = '\0';
	return p;
}

/* Validate key and build "shift:<ns>:<key>" into buf (cap bytes).  Returns
 * the full length or a negative errno with the last error set. */
static int kv_build_key(const shift_kv *h, const char *key, char *buf,
			size_t cap)
{
	size_t klen;

	if (!h)
		return kv_err(-EINVAL, "kv: NULL handle");
	if (!key || !*key)
		return kv_err(-EINVAL, "kv: empty or NULL key");
	klen = strnlen(key, SHIFT_KV_KEY_MAX + 1);
	if (klen > SHIFT_KV_KEY_MAX)
		return kv_err(-ENAMETOOLONG, "kv: key longer than %d bytes",
			      SHIFT_KV_KEY_MAX);
	if (h->prefix_len + klen + 1 > cap)
		return kv_err(-EMSGSIZE, "kv: key buffer too small");
	memcpy(buf, h->prefix, h->prefix_len);
	memcpy(buf + h->prefix_len, key, klen + 1);
	return (int)(h->prefix_len + klen);
}

#define KV_FULLKEY_CAP (2 * SHIFT_KV_NS_MAX + 9 + SHIFT_KV_KEY_MAX + 1)

int shift_kv_full_key(const shift_kv *h, const char *key, char *buf,
		      size_t cap)
{
	if (!buf)
		return kv_err(-EINVAL, "kv: NULL buffer");
	return kv_build_key(h, key, buf, cap);
}

const char *shift_kv_namespace(const shift_kv *h)
{
	return h ? h->ns : NULL;
}

const char *shift_kv_backend_name(const shift_kv *h)
{
	return h ? h->be->name : NULL;
}

/* Fill defaults into *o from user options (may be NULL); -EINVAL on a
 * negative field or retry_min > retry_max. */
static int kv_opts(const struct shift_kv_options *in, struct shift_kv_options *o)
{
	struct shift_kv_options z = { 0 };

	if (!in)
		in = &z;
	if (in->connect_timeout_ms < 0 || in->command_timeout_ms < 0 ||
	    in->retry_min_ms < 0 || in->retry_max_ms < 0 || in->poll_max_ms < 0)
		return kv_err(-EINVAL, "kv: negative option value");
	if (in->max_reply > SHIFT_KV_VALUE_MAX)
		return kv_err(-EINVAL, "kv: max_reply %zu over %u", in->max_reply,
			      SHIFT_KV_VALUE_MAX);
	*o = *in;
#define KV_DEF(f, d) do { if (!o->f) o->f = (d); } while (0)
	/* the deadline and the reply limit: the caller's, else the process'
	 * configuration (SHIFT_KV_TIMEOUT_MS, SHIFT_KV_MAX_REPLY, 0 until
	 * shift_config_load()), else the built-in defaults */
	KV_DEF(command_timeout_ms, (int)shift_config.kv_timeout_ms);
	KV_DEF(max_reply, shift_config.kv_max_reply);
	KV_DEF(connect_timeout_ms, SHIFT_KV_DEFAULT_CONNECT_TIMEOUT_MS);
	KV_DEF(command_timeout_ms, SHIFT_KV_DEFAULT_COMMAND_TIMEOUT_MS);
	KV_DEF(max_reply, SHIFT_KV_DEFAULT_MAX_REPLY);
	KV_DEF(retry_min_ms, SHIFT_KV_DEFAULT_RETRY_MIN_MS);
	KV_DEF(retry_max_ms, SHIFT_KV_DEFAULT_RETRY_MAX_MS);
	KV_DEF(poll_max_ms, SHIFT_KV_DEFAULT_POLL_MAX_MS);
	KV_DEF(secret_file, shift_config.kv_secret_file);
	KV_DEF(tls_ca, shift_config.kv_tls_ca);
	KV_DEF(tls_cert, shift_config.kv_tls_cert);
	KV_DEF(tls_key, shift_config.kv_tls_key);
	KV_DEF(job_id, shift_config.job_id);
#undef KV_DEF
	if (o->retry_min_ms > o->retry_max_ms)
		return kv_err(-EINVAL, "kv: retry_min_ms > retry_max_ms");
	return 0;
}

int shift_kv_open(const char *url, const char *ns,
		  const struct shift_kv_options *opts, shift_kv **out)
{
	shift_kv *h;
	int rc;

	if (!out)
		return kv_err(-EINVAL, "kv: NULL output handle");
	*out = NULL;
	if (!ns || !*ns)
		ns = SHIFT_KV_DEFAULT_NAMESPACE;
	rc = shift_kv_validate_namespace(ns);
	if (rc)
		return rc;
	h = calloc(1, sizeof(*h));
	if (!h)
		return kv_err(-ENOMEM, "kv: out of memory");
	rc = shift_kv_url_parse(url, &h->url);
	if (!rc)
		rc = kv_opts(opts, &h->opts);
	if (rc) {
		free(h);
		return rc;
	}
	rc = kv_auth_load(h, h->opts.secret_file);
	if (rc) {
		free(h);
		return rc;
	}
	if (*h->opts.job_id && (rc = shift_kv_validate_namespace(h->opts.job_id))) {
		free(h);
		return rc;
	}
	strcpy(h->ns, ns); /* length checked above */
	h->prefix_len = (size_t)snprintf(h->prefix, sizeof(h->prefix),
					 *h->opts.job_id ? "shift:%s:%s:" : "shift:%s:", ns,
					 h->opts.job_id);
	h->be = h->url.scheme == SHIFT_KV_SCHEME_MEM	   ? &kv_backend_mem
		: h->url.scheme == SHIFT_KV_SCHEME_CLUSTER ? &kv_backend_redis_cluster
							   : &kv_backend_redis;
	if (pthread_mutex_init(&h->lock, NULL)) {
		free(h);
		return kv_err(-ENOMEM, "kv: mutex init failed");
	}
	rc = h->be->open(h);
	if (rc) {
		pthread_mutex_destroy(&h->lock);
		free(h);
		return rc;
	}
	*out = h;
	return 0;
}

int shift_kv_open_from_env(const struct shift_kv_options *opts, shift_kv **out)
{
	return shift_kv_open(getenv(SHIFT_KV_ENV_URL),
			     getenv(SHIFT_KV_ENV_NAMESPACE), opts, out);
}

void shift_kv_close(shift_kv *h)
{
	if (!h)
		return;
	h->be->close(h);
	kv_map_clear(&h->own);
	pthread_mutex_destroy(&h->lock);
	/* the URL holds the password: do not leave it in freed memory */
	explicit_bzero(&h->url, sizeof(h->url));
	explicit_bzero(h->secret, sizeof(h->secret));
	free(h);
}

/* Deadline for one put/get/mget/delete: everything it takes, a reconnect
 * included. */
uint64_t kv_op_deadline(const shift_kv *h)
{
	return kv_now_ns() + (uint64_t)h->opts.command_timeout_ms * 1000000ull;
}

int shift_kv_put(shift_kv *h, const char *key, const void *val, size_t len,
		 uint64_t ttl_ms)
{
	char fk[KV_FULLKEY_CAP];
	int klen = kv_build_key(h, key, fk, sizeof(fk));
	int rc;

	if (klen < 0)
		return klen;
	if (!val && len)
		return kv_err(-EINVAL, "kv put: NULL value with length %zu", len);
	if (len > SHIFT_KV_VALUE_MAX)
		return kv_err(-EMSGSIZE, "kv put: value of %zu bytes exceeds %u",
			      len, SHIFT_KV_VALUE_MAX);
	if (ttl_ms > (uint64_t)1 << 40)
		return kv_err(-EINVAL, "kv put: ttl_ms %llu out of range",
			      (unsigned long long)ttl_ms);
	void *sealed = NULL;

	if (h->secret_len) {
		rc = kv_auth_seal(h, fk, (size_t)klen, val, len, &sealed, &len);
		if (rc)
			return rc;
		val = sealed;
	}
	pthread_mutex_lock(&h->lock);
	h->commands++;
	rc = kv_note(h, h->be->put(h, fk, (size_t)klen, val ? val : "", len, ttl_ms,
				    kv_op_deadline(h)));
	if (rc == 0)
		rc = kv_own_remember(h, fk, (size_t)klen, val, len, ttl_ms);
	pthread_mutex_unlock(&h->lock);
	free(sealed);
	return rc;
}

int shift_kv_get(shift_kv *h, const char *key, void **val, size_t *len)
{
	char fk[KV_FULLKEY_CAP];
	int klen = kv_build_key(h, key, fk, sizeof(fk));
	int rc;

	if (klen < 0)
		return klen;
	if (!val || !len)
		return kv_err(-EINVAL, "kv get: NULL output");
	*val = NULL;
	*len = 0;
	pthread_mutex_lock(&h->lock);
	h->commands++;
	rc = kv_note(h, h->be->get(h, fk, (size_t)klen, val, len, kv_op_deadline(h)));
	pthread_mutex_unlock(&h->lock);
	return rc ? rc : kv_auth_open(h, fk, (size_t)klen, val, len);
}

int shift_kv_mget(shift_kv *h, const char *const *keys, size_t n, void **vals,
		  size_t *lens)
{
	char (*fk)[KV_FULLKEY_CAP];
	const char *k[SHIFT_KV_MGET_MAX];
	size_t kl[SHIFT_KV_MGET_MAX];
	int rc;

	if (!h || (n && (!keys || !vals || !lens)))
		return kv_err(-EINVAL, "kv mget: NULL argument");
	if (n > SHIFT_KV_MGET_MAX)
		return kv_err(-EINVAL, "kv mget: %zu keys (at most %d)", n,
			      SHIFT_KV_MGET_MAX);
	for (size_t i = 0; i < n; i++) {
		vals[i] = NULL;
		lens[i] = 0;
	}
	if (!n)
		return 0;
	fk = malloc(n * sizeof(*fk));
	if (!fk)
		return kv_err(-ENOMEM, "kv mget: out of memory");
	for (size_t i = 0; i < n; i++) {
		int klen = kv_build_key(h, keys[i], fk[i], sizeof(fk[i]));

		if (klen < 0) {
			free(fk);
			return klen;
		}
		k[i] = fk[i];
		kl[i] = (size_t)klen;
	}
	pthread_mutex_lock(&h->lock);
	h->commands++;
	rc = kv_note(h, h->be->mget(h, k, kl, n, vals, lens, kv_op_deadline(h)));
	pthread_mutex_unlock(&h->lock);
	/* a value that does not open reads as absent */
	for (size_t i = 0; !rc && i < n; i++)
		(void)kv_auth_open(h, k[i], kl[i], &vals[i], &lens[i]);
	free(fk);
	if (rc)
		for (size_t i = 0; i < n; i++) {
			free(vals[i]);
			vals[i] = NULL;
			lens[i] = 0;
		}
	return rc;
}

/* One of h's counters, read under its lock. */
static uint64_t counter(shift_kv *h, const uint64_t *c)
{
	pthread_mutex_lock(&h->lock);
	uint64_t n = *c;

	pthread_mutex_unlock(&h->lock);
	return n;
}

uint64_t shift_kv_recoveries(shift_kv *h)
{
	return h ? counter(h, &h->recoveries) : 0;
}

uint64_t shift_kv_commands(shift_kv *h)
{
	return h ? counter(h, &h->commands) : 0;
}

int shift_kv_seal(const shift_kv *h, const char *key, const void *val, size_t len, void **out,
		  size_t *olen)
{
	char fk[KV_FULLKEY_CAP];
	int klen = kv_build_key(h, key, fk, sizeof(fk));

	if (klen < 0)
		return klen;
	if (!out || !olen || (!val && len))
		return kv_err(-EINVAL, "kv seal: NULL argument");
	if (h->secret_len)
		return kv_auth_seal(h, fk, (size_t)klen, val, len, out, olen);
	*out = kv_dup_value(val, len);
	*olen = len;
	return *out ? 0 : kv_err(-ENOMEM, "kv seal: out of memory");
}

int shift_kv_unseal(shift_kv *h, const char *key, void **v, size_t *len)
{
	char fk[KV_FULLKEY_CAP];
	int klen = kv_build_key(h, key, fk, sizeof(fk));

	if (klen < 0)
		return klen;
	if (!v || !len)
		return kv_err(-EINVAL, "kv unseal: NULL argument");
	return kv_auth_open(h, fk, (size_t)klen, v, len);
}

bool shift_kv_authenticated(const shift_kv *h)
{
	return h && h->secret_len;
}

uint64_t shift_kv_auth_failures(const shift_kv *h)
{
	return h ? __atomic_load_n(&h->auth_failures, __ATOMIC_RELAXED) : 0;
}

uint64_t shift_kv_oversize_replies(shift_kv *h)
{
	return h ? counter(h, &h->oversize) : 0;
}

int shift_kv_get_buf(shift_kv *h, const char *key, void *buf, size_t cap,
		     size_t *len)
{
	void *v;
	size_t n;
	int rc;

	if (!len || (!buf && cap))
		return kv_err(-EINVAL, "kv get_buf: NULL output");
	*len = 0;
	rc = shift_kv_get(h, key, &v, &n);
	if (rc)
		return rc;
	*len = n;
	if (n > cap) {
		free(v);
		return kv_err(-EMSGSIZE, "kv get_buf: value is %zu bytes, buffer %zu",
			      n, cap);
	}
	if (n)
		memcpy(buf, v, n);
	free(v);
	return 0;
}

int shift_kv_delete(shift_kv *h, const char *key)
{
	char fk[KV_FULLKEY_CAP];
	int klen = kv_build_key(h, key, fk, sizeof(fk));
	int rc;

	if (klen < 0)
		return klen;
	pthread_mutex_lock(&h->lock);
	h->commands++;
	rc = kv_note(h, h->be->del(h, fk, (size_t)klen, kv_op_deadline(h)));
	if (rc == 0 || rc == -ENOENT)
		kv_map_remove(&h->own, fk, (size_t)klen);
	pthread_mutex_unlock(&h->lock);
	return rc;
}

/* wait() for backends without a native one: GET, and while the key is
 * absent sleep 1, 2, 4 ... poll_max_ms (never past the deadline).  Each GET
 * is itself bounded by the deadline, so the whole call is too.  The handle
 * lock is held per GET only, never across a sleep. */
static int kv_poll_wait(shift_kv *h, const char *fk, size_t klen, void **val,
			size_t *len, uint64_t deadline, int timeout_ms)
{
	int nap = 1;

	for (;;) {
		uint64_t now = kv_now_ns();
		uint64_t d = now + (uint64_t)h->opts.command_timeout_ms * 1000000ull;
		int rc, left;

		/* a GET may use the rest of the wait, or one command timeout
		 * when the wait is shorter than that (timeout 0 = one GET) */
		if (deadline > now && deadline < d)
			d = deadline;
		pthread_mutex_lock(&h->lock);
		h->commands++;
		rc = kv_note(h, h->be->get(h, fk, klen, val, len, d));
		pthread_mutex_unlock(&h->lock);
		if (!rc)
			rc = kv_auth_open(h, fk, klen, val, len);
		if (rc != -ENOENT)
			return rc;
		left = kv_ms_left(deadline);
		if (left <= 0)
			break;
		kv_sleep_ms(nap < left ? nap : left);
		if (nap < h->opts.poll_max_ms)
			nap = nap * 2 > h->opts.poll_max_ms ? h->opts.poll_max_ms
							    : nap * 2;
	}
	return kv_err(-ETIMEDOUT, "kv wait: '%s' did not appear within %d ms",
		      fk, timeout_ms);
}

int shift_kv_wait(shift_kv *h, const char *key, int timeout_ms, void **val,
		  size_t *len)
{
	char fk[KV_FULLKEY_CAP];
	int klen = kv_build_key(h, key, fk, sizeof(fk));
	uint64_t deadline;

	if (klen < 0)
		return klen;
	if (!val || !len)
		return kv_err(-EINVAL, "kv wait: NULL output");
	if (timeout_ms < 0)
		return kv_err(-EINVAL, "kv wait: negative timeout");
	*val = NULL;
	*len = 0;
	deadline = kv_now_ns() + (uint64_t)timeout_ms * 1000000ull;
	if (h->be->wait) {
		int rc = h->be->wait(h, fk, (size_t)klen, val, len, deadline);

		/* a value that does not open is as good as absent: wait on for
		 * a real one, polling, until the same deadline */
		if (!rc && kv_auth_open(h, fk, (size_t)klen, val, len) == -ENOENT)
			return kv_poll_wait(h, fk, (size_t)klen, val, len, deadline,
					    timeout_ms);

		if (rc == -ETIMEDOUT)
			kv_err(rc, "kv wait: '%s' did not appear within %d ms",
			       fk, timeout_ms);
		return rc;
	}
	return kv_poll_wait(h, fk, (size_t)klen, val, len, deadline, timeout_ms);
}
