/*
 * Key mailboxes: a small slot per protected QP, in memory registered on the
 * backup PD, through which the two ends' background threads pass an MR's
 * backup key over the backup path when the KV store cannot give it (memory
 * the peer registered while the store was gone: in no record). The slot's
 * address and rkey are in the QP's record (shift_qp_value.mb_*), read at
 * connection time with the backup QPN, before any outage.
 *
 * A slot holds what the peer writes into it with RDMA WRITEs (its request
 * to me, its answer to my request) and the staging area of my own writes.
 * Each message ends with a check over its words: a reader that sees a
 * message only partly placed (no completion orders the peer's WRITE with
 * my read) takes it at a later look. The protocol is fo/mbox.c; this is the
 * memory: pages of SHIFT_MBOX_PER_PAGE slots, one MR each, per backup PD,
 * on the RNIC's thread.
 */
#ifndef SHIFT_SHADOW_MBOX_H
#define SHIFT_SHADOW_MBOX_H

#include <stdint.h>

/* a request: "the backup key of my peer's... your MR of rkey `rkey`?" */
struct shift_mbox_req {
	uint64_t nonce; /* nonzero, random: the answer echoes it */
	uint32_t rkey;
	uint32_t pad;
	uint64_t check;
};

enum {
	SHIFT_MBOX_KNOWN = 1,  /* bk, and the range if RANGED, are valid */
	SHIFT_MBOX_RANGED = 2,
	SHIFT_MBOX_ABSENT = 4, /* no MR of that rkey with a backup here */
};

struct shift_mbox_ans {
	uint64_t nonce; /* the request's */
	uint32_t rkey;  /* the request's */
	uint32_t flags; /* SHIFT_MBOX_* */
	uint32_t bk;
	uint32_t pad;
	uint64_t addr, len;
	uint64_t check;
};

struct shift_mbox_slot {
	struct shift_mbox_req req;     /* written by the peer: its request */
	struct shift_mbox_ans ans;     /* written by the peer: its answer */
	struct shift_mbox_req out_req; /* staging of my request to the peer */
	struct shift_mbox_ans out_ans; /* staging of my answer to the peer */
};

#define SHIFT_MBOX_PAGE 4096u
#define SHIFT_MBOX_PER_PAGE (SHIFT_MBOX_PAGE / sizeof(struct shift_mbox_slot))

uint64_t shift_mbox_req_check(const struct shift_mbox_req *m);
uint64_t shift_mbox_ans_check(const struct shift_mbox_ans *m);

/* A copy of what the peer wrote at src (a slot's req or ans), read word by
 * word (the peer's NIC may be writing it). */
void shift_mbox_read_req(const struct shift_mbox_req *src, struct shift_mbox_req *out);
void shift_mbox_read_ans(const struct shift_mbox_ans *src, struct shift_mbox_ans *out);

#endif /* SHIFT_SHADOW_MBOX_H */
