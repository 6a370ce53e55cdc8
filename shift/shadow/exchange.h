/*
 * What the two ends of a connection exchange through the key-value store,
 * and how it is spelled. Keys derive from what the application already
 * exchanged itself:
 *   qp:{<default GID, 32 hex>}:<default QPN>  -> the backup QP's GID, QPN, PSN, MTU
 *   mr:{<default GID, 32 hex>}:<default rkey> -> the backup MR's rkey
 *   ep:{<GID>}:<QPN> (failover episodes), poke:{<GID>} (wake a passive peer)
 *   mri:{<default GID>}:<index id, 16 hex>:<chunk> -> the rkeys of every MR
 *     one process published under that GID (its MR index, read ahead by
 *     its peers: shadow/mrindex.c); the index id is in its QP records
 * The GID in braces is a Redis Cluster hash tag: every record one host
 * publishes lands in one hash slot, so a peer reads a host's records with
 * one MGET on one node (kv_redis_cluster.c).
 * Values are versioned text ("shift1 qp ..."), validated on read: a value
 * of another version or with a missing or out-of-range field is rejected.
 */
#ifndef SHIFT_EXCHANGE_H
#define SHIFT_EXCHANGE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <infiniband/verbs.h>

#define SHIFT_EXCHANGE_VERSION "shift1"
#define SHIFT_EXCHANGE_KEY_MAX 80
#define SHIFT_EXCHANGE_VALUE_MAX 256

struct shift_qp_key {
	union ibv_gid gid;
	uint32_t qpn;
};

struct shift_qp_value {
	union ibv_gid gid; /* backup GID */
	uint32_t qpn;      /* backup QPN */
	uint32_t psn;      /* backup QP's initial send PSN */
	uint32_t mtu;      /* enum ibv_mtu of the backup port */
	/* the default QP the writer's default QP is connected to: the reader
	 * takes the record only if that is its own (a record without it, from
	 * an older writer, is read too) */
	bool has_peer;
	struct shift_qp_key peer;
	/* the writer's MR index (mri:{<its GID>}:<mri>:...), nonzero; a record
	 * without it (an older writer) is read too */
	bool has_mri;
	uint64_t mri;
	/* the writer's key mailbox for this connection (shadow/mbox.h): its
	 * address and rkey on the backup NIC; a record without it (an older
	 * writer, or a backup QP without remote writes) is read too */
	bool has_mb;
	uint64_t mb_addr;
	uint32_t mb_rkey;
	/* the writer's service channels (shadow/svc.h): their UD QPNs on the
	 * backup NIC and on the default NIC; a record without them is read
	 * too (no channel) */
	bool has_svc;
	uint32_t svc, dsvc;
};

int shift_exchange_qp_key(const struct shift_qp_key *k, char *buf, size_t cap);
/* A connection end's failover episodes, under its default (GID, QPN). */
int shift_exchange_ep_key(const struct shift_qp_key *k, char *buf, size_t cap);
int shift_exchange_ep_encode(unsigned gen, unsigned started, char *buf, size_t cap);
int shift_exchange_ep_decode(const char *s, size_t len, unsigned *gen, unsigned *started);
/* The whole record: also, for a return episode (the backup failed, both
 * ends back on the default QPs), the end's receive counter once its
 * receives are there, and whether the end's backup path failed in its
 * current episode (the prober decides what follows) */
struct shift_ep_value {
	unsigned gen, started;
	bool ret;        /* a return episode's record ... */
	uint32_t count;  /* ... with the end's receive counter */
	bool bkfail;
	bool nosend;     /* the end's application never sends (its QP stays at RTR) */
	bool closed;     /* the end's application ended the connection while it was
			  * failed over (its own error, its ERR or RESET) */
	uint32_t seq;    /* the end's count of its records (0: not said): a reader
			  * that got a later one another way keeps that */
};
int shift_exchange_ep_encode_ex(const struct shift_ep_value *v, char *buf, size_t cap);
int shift_exchange_ep_decode_ex(const char *s, size_t len, struct shift_ep_value *v);
/* Where the ends that need a NIC's peers to read their records say so
 * (a failover the peer never saw, see fo/poke.c) */
int shift_exchange_poke_key(const union ibv_gid *gid, char *buf, size_t cap);
int shift_exchange_mr_key(const union ibv_gid *gid, uint32_t rkey, char *buf,
			  size_t cap);
/* Encoders return the length written, or -EMSGSIZE. */
int shift_exchange_qp_encode(const struct shift_qp_value *v, char *buf, size_t cap);
/* An MR's record: its backup rkey, and the remote address range the
 * application's MR answers to ([addr, addr + len): its address, or its
 * IOVA), which the peer checks a failed-over WR against. A record without
 * the range (has_range false: an older writer) is read too. */
struct shift_mr_value {
	uint32_t bk_rkey;
	bool has_range;
	uint64_t addr, len;
};
int shift_exchange_mr_encode(const struct shift_mr_value *v, char *buf, size_t cap);
/* Decoders return 0, or -EINVAL for anything but a well-formed value of
 * this version. s need not be NUL-terminated. */
int shift_exchange_qp_decode(const char *s, size_t len, struct shift_qp_value *v);
int shift_exchange_mr_decode(const char *s, size_t len, struct shift_mr_value *v);

/*
 * An MR index: the application rkeys of every MR one process published
 * under one GID, in chunks of at most SHIFT_MRI_CHUNK_KEYS. Each chunk
 * tells the index's version (the writer's count of its rewrites) and how
 * many chunks it has; a reader takes a version only when all its chunks
 * agree on it. Chunk 0 is written last.
 */
/* (a chunk, sealed, fits the smallest SHIFT_KV_MAX_REPLY, 1024) */
#define SHIFT_MRI_CHUNK_KEYS 64
#define SHIFT_MRI_CHUNKS 256
#define SHIFT_MRI_VALUE_MAX (64 + 11 * SHIFT_MRI_CHUNK_KEYS)
struct shift_mri_chunk {
	uint64_t ver;
	unsigned chunks; /* 1..SHIFT_MRI_CHUNKS */
	unsigned n;      /* keys in this chunk */
	uint32_t keys[SHIFT_MRI_CHUNK_KEYS];
};
int shift_exchange_mri_key(const union ibv_gid *gid, uint64_t id, unsigned chunk, char *buf,
			   size_t cap);
int shift_exchange_mri_encode(const struct shift_mri_chunk *c, char *buf, size_t cap);
int shift_exchange_mri_decode(const char *s, size_t len, struct shift_mri_chunk *c);

void shift_gid_hex(const union ibv_gid *gid, char out[33]);

#endif /* SHIFT_EXCHANGE_H */
