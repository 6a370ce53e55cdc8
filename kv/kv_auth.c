/*
 * kv/kv_auth.c - authenticated records: every value a handle with a
 * secret writes is sealed, every value it reads must open (kv_backend.h).
 *
 * The per-job secret comes from a file (SHIFT_KV_SECRET_FILE, or the
 * secret_file option): untrusted input like every file SHIFT reads, so it
 * must be a regular file (not a link) owned by the caller or root, readable
 * by nobody else (no group/other bits), of 16..4096 bytes (one trailing
 * newline dropped).
 *
 * Sealed value: "m1:" + 64 hex digits of HMAC-SHA256 + ":" + payload, the
 * MAC under the secret over a domain tag, the namespace, the full key and
 * the payload, each length-prefixed so no two inputs share an encoding.
 * The full key binds a record to its place: a valid record copied under
 * another key (another QP's, another GID's) does not open there. The
 * secret is the job's identity: a record an earlier job wrote in the same
 * namespace under its own secret does not open either. A value that does
 * not open (no envelope, a wrong MAC, a record of another job or key) is
 * never handed to the caller: it reads as absent (-ENOENT), is counted
 * (shift_kv_auth_failures) and logged once per handle.
 *
 * HMAC-SHA256 is OpenSSL's libcrypto (EVP_MAC "HMAC" with SHA256), compared
 * with CRYPTO_memcmp.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/params.h>

#include "kv/kv_backend.h"
#include "shift/base/log.h"

#define KV_AUTH_TAG "m1:"
#define KV_AUTH_HDR (3 + 64 + 1) /* "m1:" hex ":" */

int kv_auth_load(shift_kv *h, const char *path)
{
	unsigned char buf[KV_SECRET_MAX + 2];
	struct stat st;
	ssize_t n;
	int fd;

	if (!path || !path[0])
		return 0;
	if (path[0] != '/')
		return kv_err(-EINVAL, "kv secret file '%.200s': not an absolute path", path);
	fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0)
		return kv_err(-errno, "kv secret file '%.200s': %s", path, strerror(errno));
	if (fstat(fd, &st) || !S_ISREG(st.st_mode)) {
		close(fd);
		return kv_err(-EINVAL, "kv secret file '%.200s': not a regular file", path);
	}
	if ((st.st_uid != geteuid() && st.st_uid != 0) || (st.st_mode & 077)) {
		close(fd);
		return kv_err(-EACCES,
			      "kv secret file '%.200s': must be owned by you or root and "
			      "readable by nobody else (mode 0600 or 0400)", path);
	}
	n = read(fd, buf, sizeof(buf));
	close(fd);
	if (n > 0 && buf[n - 1] == '\n')
		n--;
	if (n < KV_SECRET_MIN || n > KV_SECRET_MAX) {
		explicit_bzero(buf, sizeof(buf));
		return kv_err(-EINVAL, "kv secret file '%.200s': the secret must be %d..%d bytes",
			      path, KV_SECRET_MIN, KV_SECRET_MAX);
	}
	memcpy(h->secret, buf, (size_t)n);
	h->secret_len = (size_t)n;
	explicit_bzero(buf, sizeof(buf));
	return 0;
}

/* The MAC of (tag, namespace, full key, payload), each length-prefixed. */
static int kv_auth_mac(const shift_kv *h, const char *fk, size_t klen,
		       const void *v, size_t vlen, unsigned char mac[32])
{
	static const char tag[] = "shift-kv-record-v1";
	const void *part[4] = { tag, h->ns, fk, v };
	size_t plen[4] = { sizeof(tag) - 1, strlen(h->ns), klen, vlen };
	char digest[] = "SHA256";
	OSSL_PARAM params[] = {
		OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, digest, 0),
		OSSL_PARAM_construct_end(),
	};
	EVP_MAC *m = EVP_MAC_fetch(NULL, "HMAC", NULL);
	EVP_MAC_CTX *c = m ? EVP_MAC_CTX_new(m) : NULL;
	size_t maclen = 0;
	int ok = c && EVP_MAC_init(c, h->secret, h->secret_len, params);

	for (int i = 0; ok && i < 4; i++) {
		unsigned char len8[8];

		for (int b = 0; b < 8; b++)
			len8[b] = (unsigned char)((uint64_t)plen[i] >> (8 * b));
		ok = EVP_MAC_update(c, len8, sizeof(len8)) &&
		     (!plen[i] || EVP_MAC_update(c, part[i], plen[i]));
	}
	ok = ok && EVP_MAC_final(c, mac, &maclen, 32) && maclen == 32;
	EVP_MAC_CTX_free(c);
	EVP_MAC_free(m);
	return ok ? 0 : kv_err(-EIO, "kv: HMAC-SHA256 failed (libcrypto)");
}

int kv_auth_seal(const shift_kv *h, const char *fk, size_t klen, const void *v,
		 size_t vlen, void **out, size_t *outlen)
{
	static const char hex[] = "0123456789abcdef";
	unsigned char mac[32];
	char *s;
	int rc = kv_auth_mac(h, fk, klen, v, vlen, mac);

	if (rc)
		return rc;
	s = malloc(KV_AUTH_HDR + vlen + 1);
	if (!s)
		return kv_err(-ENOMEM, "kv put: out of memory");
	memcpy(s, KV_AUTH_TAG, 3);
	for (int i = 0; i < 32; i++) {
		s[3 + 2 * i] = hex[mac[i] >> 4];
		s[4 + 2 * i] = hex[mac[i] & 15];
	}
	s[KV_AUTH_HDR - 1] = ':';
	if (vlen)
		memcpy(s + KV_AUTH_HDR, v, vlen);
	s[KV_AUTH_HDR + vlen] = '\0';
	*out = s;
	*outlen = KV_AUTH_HDR + vlen;
	return 0;
}

static int kv_hex(char c)
{
	return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
}

/* Does the sealed value s[0..n) open under key fk? */
static bool kv_auth_ok(const shift_kv *h, const char *fk, size_t klen,
		       const char *s, size_t n)
{
	unsigned char want[32], got[32];

	if (n < KV_AUTH_HDR || memcmp(s, KV_AUTH_TAG, 3) || s[KV_AUTH_HDR - 1] != ':')
		return false;
	for (int i = 0; i < 32; i++) {
		int hi = kv_hex(s[3 + 2 * i]), lo = kv_hex(s[4 + 2 * i]);

		if (hi < 0 || lo < 0)
			return false;
		got[i] = (unsigned char)(hi << 4 | lo);
	}
	if (kv_auth_mac(h, fk, klen, s + KV_AUTH_HDR, n - KV_AUTH_HDR, want))
		return false;
	return CRYPTO_memcmp(want, got, sizeof(want)) == 0;
}

int kv_auth_open(shift_kv *h, const char *fk, size_t klen, void **v, size_t *vlen)
{
	char *s = *v;

	if (!h->secret_len || !s)
		return 0;
	if (kv_auth_ok(h, fk, klen, s, *vlen)) {
		*vlen -= KV_AUTH_HDR;
		memmove(s, s + KV_AUTH_HDR, *vlen + 1); /* with the trailing NUL */
		return 0;
	}
	free(s);
	*v = NULL;
	*vlen = 0;
	if (__atomic_fetch_add(&h->auth_failures, 1, __ATOMIC_RELAXED) == 0)
		shift_warn("kv: record '%.200s' failed authentication (forged, written under "
			   "another key, or by another job's secret): ignored; later ones are "
			   "counted, not logged", fk);
	return kv_err(-ENOENT, "kv: record '%.200s' failed authentication: ignored", fk);
}
