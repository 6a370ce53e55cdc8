/*
 * kv/kv_types.h - the kv layer's limits and plain data types.
 *
 * Shared by the public API (kv.h, which includes this file; other modules
 * include kv.h, not this) and the backend interface (kv_backend.h), so that
 * neither of those needs the other.  Types and constants only.
 */
#ifndef SHIFT_KV_TYPES_H
#define SHIFT_KV_TYPES_H

#include <stdbool.h>

#define SHIFT_KV_NS_MAX 64        /* namespace: 1..64 of [A-Za-z0-9_.-] */
#define SHIFT_KV_KEY_MAX 400      /* key: 1..400 bytes, any but NUL */
#define SHIFT_KV_VALUE_MAX (1u << 20) /* largest value put() accepts */
#define SHIFT_KV_URL_MAX 1024
#define SHIFT_KV_MEM_NAME_MAX 64  /* mem://NAME: 1..64 of [A-Za-z0-9_.-] */
#define SHIFT_KV_MGET_MAX 256     /* most keys one shift_kv_mget() takes */
#define SHIFT_KV_ADDRS_MAX 8      /* redis-sentinel://, redis-cluster://: most addresses */
#define SHIFT_KV_MASTER_MAX 64    /* redis-sentinel://: master name, [A-Za-z0-9_.-] */

typedef struct shift_kv shift_kv;

/* Tunables; a zero field means "use the default" (SHIFT_KV_DEFAULT_* in
 * kv.h).  Negative -> -EINVAL. */
struct shift_kv_options {
	int connect_timeout_ms; /* bound on the TCP connect itself */
	/* total deadline of one command: the (re)connect with AUTH/SELECT if
	 * one is needed, the write and the whole reply (SHIFT_KV_TIMEOUT_MS) */
	int command_timeout_ms;
	int retry_min_ms;       /* first reconnect back-off after a failure */
	int retry_max_ms;       /* back-off doubles up to this */
	int poll_max_ms;        /* wait() on redis: longest sleep between GETs */
	bool lazy_connect;      /* open() does not connect; first op does */
	/* largest value (bulk string, status line) a reply may carry; a
	 * larger one is refused before its body is read (SHIFT_KV_MAX_REPLY;
	 * at most SHIFT_KV_VALUE_MAX) */
	size_t max_reply;
	/* per-job secret file: records are sealed and checked with
	 * HMAC-SHA256 (kv_auth.c); NULL = SHIFT_KV_SECRET_FILE, "" = none */
	const char *secret_file;
	/* rediss:// only: the CA file the server is verified against (NULL =
	 * SHIFT_KV_TLS_CA; "" = the system's trust store) and the client
	 * certificate and key (NULL = SHIFT_KV_TLS_CERT/KEY; "" = none) */
	const char *tls_ca, *tls_cert, *tls_key;
	/* the job's run, in every key after the namespace ("shift:NS:JOB:"),
	 * same rules as a namespace; NULL = shift_config.job_id, "" = none */
	const char *job_id;
};

enum shift_kv_scheme {
	SHIFT_KV_SCHEME_REDIS = 1,
	SHIFT_KV_SCHEME_MEM = 2,
	/* Redis behind Sentinel: the primary is asked of the sentinels at
	 * every (re)connect (kv_redis_sentinel.c) */
	SHIFT_KV_SCHEME_SENTINEL = 3,
	/* Redis Cluster: the slot map is asked of the seed nodes, each key
	 * goes to its slot's primary (kv_redis_cluster.c) */
	SHIFT_KV_SCHEME_CLUSTER = 4,
};

/* One server's address (a sentinel, a cluster node). */
struct shift_kv_addr {
	char host[256]; /* hostname or IP (IPv6 without brackets) */
	int port;
};

/* A parsed URL.  user/password are empty when absent; password is never
 * printed by this library. */
struct shift_kv_url {
	enum shift_kv_scheme scheme;
	char user[128];
	char password[256];
	char host[256];   /* redis: hostname or IP (IPv6 without brackets) */
	int port;         /* redis: 1..65535 (6379 when omitted) */
	int db;           /* redis: 0..65535 (0 when omitted) */
	char name[SHIFT_KV_MEM_NAME_MAX + 1]; /* mem: store name */
	/* sentinel: the sentinels, in the URL's order, and the master name
	 * they monitor; cluster: the seed nodes; host/port above are unused */
	int naddrs;
	struct shift_kv_addr addr[SHIFT_KV_ADDRS_MAX];
	char master[SHIFT_KV_MASTER_MAX + 1];
	bool tls;         /* rediss://: TLS (kv_tls.c) */
};

#endif /* SHIFT_KV_TYPES_H */
