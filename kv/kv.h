/*
 * kv/kv.h - SHIFT's small key-value interface.
 *
 * SHIFT exchanges backup QP/MR attributes between the two ends of a
 * connection through a key-value store.  This header is the whole public
 * surface: open a handle from a URL (redis://... in production, mem://NAME in
 * unit tests), put/get/delete byte values, wait for a key to appear with a
 * bounded timeout, and remove the keys this handle published.  Every key is
 * stored as "shift:<namespace>:<key>".  The limits and data types it uses
 * (SHIFT_KV_*_MAX, shift_kv, struct shift_kv_options, struct shift_kv_url)
 * are in kv/kv_types.h, which this header includes.
 *
 * Return convention: 0 (or a non-negative count/length) on success, a
 * negative errno value on failure; shift_kv_last_error() then holds a
 * one-line explanation for the calling thread.  Nothing here aborts.
 *   -EINVAL        bad argument, URL or namespace
 *   -ENAMETOOLONG  key too long
 *   -EMSGSIZE      value too large, caller buffer too small, or a reply
 *                  over max_reply (SHIFT_KV_MAX_REPLY) refused
 *   -ENOENT        key absent (or expired)
 *   -ETIMEDOUT     shift_kv_wait(): the key did not appear in time
 *   -ENOTCONN      store unreachable / connection broken / command missed
 *                  its deadline (command_timeout_ms, SHIFT_KV_TIMEOUT_MS)
 *                  / backing off before the next reconnect attempt
 *   -EACCES        authentication refused
 *   -EPROTO        the server answered with an error or an unexpected reply
 *   -ENOMEM        out of memory
 *
 * Thread safety: a handle may be shared by threads; each handle holds one
 * connection and a mutex that serialises its commands (shift_kv_wait() does
 * not hold it while sleeping).  For parallelism open one handle per thread.
 * See docs/kv.md.
 */
#ifndef SHIFT_KV_H
#define SHIFT_KV_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kv/kv_types.h" /* limits, shift_kv, options and URL structs */

#define SHIFT_KV_DEFAULT_URL "redis://127.0.0.1:6379"
#define SHIFT_KV_DEFAULT_NAMESPACE "default"
#define SHIFT_KV_ENV_URL "SHIFT_KV_URL"
#define SHIFT_KV_ENV_NAMESPACE "SHIFT_KV_NAMESPACE"

#define SHIFT_KV_DEFAULT_CONNECT_TIMEOUT_MS 500
#define SHIFT_KV_DEFAULT_COMMAND_TIMEOUT_MS 300 /* total, per command */
#define SHIFT_KV_DEFAULT_MAX_REPLY (64u << 10)
#define SHIFT_KV_DEFAULT_RETRY_MIN_MS 50
#define SHIFT_KV_DEFAULT_RETRY_MAX_MS 2000
#define SHIFT_KV_DEFAULT_POLL_MAX_MS 20

/* Parse and validate url (NULL or "" -> SHIFT_KV_DEFAULT_URL) into *out.
 * Accepted: redis://[user:password@]host[:port][/db], redis://:password@...,
 * rediss://... (the same over TLS),
 * mem://NAME.  User and password may use %XX escapes.  Returns 0 or -EINVAL. */
int shift_kv_url_parse(const char *url, struct shift_kv_url *out);

/* 0 if ns is a valid namespace (1..SHIFT_KV_NS_MAX of [A-Za-z0-9_.-]),
 * else -EINVAL. */
int shift_kv_validate_namespace(const char *ns);

/* Open a handle on url (NULL/"" -> default) with namespace ns (NULL/"" ->
 * SHIFT_KV_DEFAULT_NAMESPACE).  opts may be NULL.  Unless lazy_connect, the
 * store is contacted now, bounded by connect_timeout_ms (DNS resolution of a
 * host name is not bounded by it; use an IP).  On success *out is the handle
 * and 0 is returned; on failure *out is NULL. */
int shift_kv_open(const char *url, const char *ns,
		  const struct shift_kv_options *opts, shift_kv **out);

/* shift_kv_open() with url from $SHIFT_KV_URL and namespace from
 * $SHIFT_KV_NAMESPACE (each defaulted when unset or empty). */
int shift_kv_open_from_env(const struct shift_kv_options *opts, shift_kv **out);

/* Release the handle and its connection.  Keys stay in the store (call
 * shift_kv_delete_own() first to remove them).  NULL is a no-op. */
void shift_kv_close(shift_kv *h);

/* Store len bytes at val under key, replacing any old value.  ttl_ms > 0
 * makes the key expire after that many milliseconds; 0 means no expiry.
 * val may be NULL only when len is 0.  The key is remembered for
 * shift_kv_delete_own(). */
int shift_kv_put(shift_kv *h, const char *key, const void *val, size_t len,
		 uint64_t ttl_ms);

/* Fetch key.  On success *val is a malloc'd copy (caller free()s; it has one
 * extra NUL byte after the value for convenience) and *len its length. */
int shift_kv_get(shift_kv *h, const char *key, void **val, size_t *len);

/* The values of n keys (n <= SHIFT_KV_MGET_MAX) in one round trip (redis
 * MGET): vals[i] and lens[i] as shift_kv_get() returns them, vals[i] NULL
 * for an absent key.  0, or a negative errno for the whole call (then every
 * vals[i] is NULL).  The caller frees each vals[i]. */
int shift_kv_mget(shift_kv *h, const char *const *keys, size_t n, void **vals,
		  size_t *lens);

/* How often the store answered this handle again after failing it (an
 * outage: unreachable, too slow, the connection closed). A store that
 * restarted may have lost every record: the caller writes its own again
 * (shift_kv_refresh_own). */
uint64_t shift_kv_recoveries(shift_kv *h);

/* Backend commands (round trips) this handle has issued: put, get, del,
 * mget, and each poll of a wait.  For tests and statistics. */
uint64_t shift_kv_commands(shift_kv *h);

/* Replies this handle refused because they announced a value over
 * max_reply (each one -EMSGSIZE, a dropped connection, and at most one log
 * line a second). */
uint64_t shift_kv_oversize_replies(shift_kv *h);

/* Does h seal and check its records (a secret file was given)? */
bool shift_kv_authenticated(const shift_kv *h);
/* A record that travels another way than the store (SHIFT's datagrams,
 * shift/fo/dgram.c), sealed and opened as put() and get() would under key:
 * seal gives the value as put() would write it (*out malloc'd; without a
 * secret, a copy); unseal replaces the value (v, len; malloc'd) with what
 * get() would return: -ENOENT (freed, counted as a read that failed
 * authentication) if it does not open. 0 or a negative errno. */
int shift_kv_seal(const shift_kv *h, const char *key, const void *val, size_t len, void **out,
		  size_t *olen);
int shift_kv_unseal(shift_kv *h, const char *key, void **v, size_t *len);
/* Values h read that failed authentication and were ignored (each one
 * read as absent; the first is logged). */
uint64_t shift_kv_auth_failures(const shift_kv *h);

/* Fetch key into buf (capacity cap).  *len receives the value length; if it
 * exceeds cap nothing is copied and -EMSGSIZE is returned. */
int shift_kv_get_buf(shift_kv *h, const char *key, void *buf, size_t cap,
		     size_t *len);

/* Remove key.  0 if it was removed, -ENOENT if it did not exist. */
int shift_kv_delete(shift_kv *h, const char *key);

/* Return key's value as shift_kv_get() does, waiting up to timeout_ms
 * (0 = check once) for it to appear.  -ETIMEDOUT if it does not; a store
 * outage fails fast with -ENOTCONN instead of waiting out the timeout.
 * Never blocks longer than timeout_ms plus scheduling slack (timeout 0: one
 * lookup, bounded like shift_kv_get()). */
int shift_kv_wait(shift_kv *h, const char *key, int timeout_ms, void **val,
		  size_t *len);

/* Delete every key this handle put and has not deleted since (meant for the
 * owner's exit path).  Keys that could not be deleted stay remembered so a
 * later call can retry.  Returns the number deleted, or the first error. */
int shift_kv_delete_own(shift_kv *h);

/* Number of keys shift_kv_delete_own() would try to delete. */
size_t shift_kv_own_count(shift_kv *h);
/* Write up to max of this handle's keys that have a TTL again, with their
 * value and TTL as put, from where the last call stopped (round robin):
 * their TTL starts anew, and a store that lost them (restarted empty) has
 * them back.  The number written, or the first error (the rest wait for
 * the next call). */
int shift_kv_refresh_own(shift_kv *h, size_t max);

/* Write the stored form of key ("shift:<ns>:<key>") into buf.  Returns its
 * length (excluding the NUL), -EINVAL/-ENAMETOOLONG on a bad key, or
 * -EMSGSIZE if cap is too small. */
int shift_kv_full_key(const shift_kv *h, const char *key, char *buf,
		      size_t cap);

/* The handle's namespace and backend name ("redis", "redis-cluster" or
 * "mem"). */
const char *shift_kv_namespace(const shift_kv *h);
const char *shift_kv_backend_name(const shift_kv *h);

/* One-line explanation of the calling thread's last failed kv call. */
const char *shift_kv_last_error(void);

/* Short static description of a return code. */
const char *shift_kv_strerror(int rc);

/* mem:// fault injection and reset (tests).  set_down(true) makes every
 * operation on store NAME fail with -ENOTCONN (waiters are woken and fail)
 * until set_down(false).  clear() drops every key.  Both create the store if
 * it does not exist yet.  Return 0 or -EINVAL/-ENOMEM. */
int shift_kv_mem_set_down(const char *name, bool down);
int shift_kv_mem_clear(const char *name);
/* The entry numbered pick (modulo their count, in the order the entries
 * were created, so that a seeded caller picks the same record in every run
 * whatever random bytes the keys hold) deleted, or with garble a byte of
 * its value flipped: a record lost or damaged.  0, -ENOENT if the store is
 * empty, or -EINVAL/-ENOMEM. */
int shift_kv_mem_spoil(const char *name, uint64_t pick, bool garble);

#endif /* SHIFT_KV_H */
