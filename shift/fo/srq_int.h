/*
 * What the files of QPs on a shared receive queue share (fo/srq.c: moving
 * an SRQ, SHIFT's receives on the backup QPs, failback; fo/srq_deliver.c:
 * handing what arrives there to the application; fo/srq_burn.c: taking
 * WQEs out of the default SRQ). Private to them.
 */
#ifndef SHIFT_FO_SRQ_INT_H
#define SHIFT_FO_SRQ_INT_H

#include "shift/fo/fo_int.h"
#include "shift/dp/dsrq.h"

/* READY: not a slot, a completion of the default path held behind the
 * messages that arrived before it (defer()) */
enum { SLOT_FREE, SLOT_POSTED, SLOT_PENDING, SLOT_READY };

struct slot {
	struct slot *next;      /* the SRQ's pending FIFO */
	struct shift_dqp *d;
	struct shift_cq *c;     /* READY: its CQ (NULL: d's receive CQ) */
	struct ibv_wc wc;
	uint8_t state;
	unsigned gen;           /* the backup generation it was posted in */
};

struct bounce {
	uint8_t *buf;
	uint32_t len;           /* bytes per slot */
	struct ibv_mr *mr;      /* on the backup QP's PD */
	bool notify_due;        /* the next receive on the reset default QP is
				 * the peer's failback notification */
	/* receive completions of the reset default QP before my receives are
	 * back: later than every message of the backup path (the peer sends
	 * there only after its notification), held until those are out */
	struct slot *held_head, *held_tail;
	uint32_t late;          /* ... how many (not in the notification's count) */
	struct slot slot[SHIFT_SRQ_BOUNCE];
};

struct bounce *fo_srq_bounce_of(struct shift_dqp *d);
int fo_srq_post_slot(struct shift_dqp *d, struct bounce *b, unsigned k);
unsigned fo_srq_waiting(const struct shift_dsrq *q);

#endif /* SHIFT_FO_SRQ_INT_H */
