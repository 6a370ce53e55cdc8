/*
 * Native work-queue access: the design's way of finding a failed QP's
 * outstanding WQEs, by reading them back from the provider's own queues,
 * instead of mirroring every posted WR (dqp.h).
 *
 * A provider that can describe a QP's queue buffers (mlx5 through its
 * direct-verbs API, providers/mlx5_wqe.c) fills a struct shift_nwq for it.
 * A post of a WR whose copy would cost more than reading its WQE index
 * (inline data, several SGEs, an atomic; dp/post.c) then records in the
 * mirror ring only what the provider's WQE does not hold or what SHIFT
 * needs before a failover: the wr_id, opcode and flags, and where the WQE
 * starts in the provider's queue (read from the provider's producer
 * counter, its doorbell record, before the post). The entry's num_sge says
 * SHIFT_WQE_NATIVE. When a failover starts, with every post held,
 * shift_dqp_native_fill() decodes each outstanding native entry's WQE into
 * a full mirror entry, and from there the failover layer works on the
 * mirror as on any other QP.
 *
 * A WQE is read back only if it is still the one posted: the provider's
 * own index in it (mlx5's control segment) and the opcode must match. A
 * provider reuses a slot only after the WR in it completed and was polled,
 * so an outstanding WR's WQE is always intact; an entry that does not
 * decode is left native, and a failover that still finds one among its
 * outstanding WRs after draining the default CQs cannot go on (the QP then
 * fails as it would have without SHIFT, said in one log line).
 */
#ifndef SHIFT_DP_NWQ_H
#define SHIFT_DP_NWQ_H

#include <stdbool.h>
#include <stdint.h>

#include "shift/dp/dqp.h"

/* num_sge of an entry whose WR only the provider's queue holds */
#define SHIFT_WQE_NATIVE 0xffffffffu

struct shift_nwq {
	const char *format;           /* "mlx5" */
	uint32_t qpn;
	/* send queue: sq_cnt basic blocks of sq_bb bytes (powers of two) */
	const uint8_t *sq_buf;
	uint32_t sq_cnt, sq_bb;
	/* receive queue: rq_cnt WQEs of rq_stride bytes (0: none, an SRQ's) */
	const uint8_t *rq_buf;
	uint32_t rq_cnt, rq_stride;
	/* producer counters as the provider last published them (big-endian,
	 * the low 16 bits the next WQE's index) */
	const volatile uint32_t *sq_dbrec, *rq_dbrec;
	/* decode the send WQE at idx into e (wr_id, opcode and send_flags as
	 * recorded; e has room for max_sge SGEs and max_inline bytes after
	 * them): 0, or -1 if it is not a WQE of that opcode posted at idx */
	int (*read_send)(const struct shift_nwq *q, uint32_t idx, struct shift_swqe *e,
			 uint32_t max_sge, uint32_t max_inline);
	/* the same for the receive WQE at idx (wr_id as recorded) */
	int (*read_recv)(const struct shift_nwq *q, uint32_t idx, struct shift_rwqe *e,
			 uint32_t max_sge);
};

/* The provider's next send (receive) WQE index, as a post records it. */
static inline uint32_t shift_nwq_index(const volatile uint32_t *dbrec)
{
	return __builtin_bswap32(*dbrec) & 0xffff;
}

/* Give d native access through q (d takes it over; freed with d). Before
 * d's first post. */
void shift_dqp_set_native(struct shift_dqp *d, struct shift_nwq *q);

/* Is send opcode op one a native post records (its WQE decodes)? */
static inline bool shift_nwq_send_op(unsigned op)
{
	return op <= IBV_WR_ATOMIC_FETCH_AND_ADD || op == IBV_WR_SEND_WITH_INV;
}

/* Decode the native entries of the outstanding WRs, sends from send_from
 * and receives from recv_from to the heads (post_lock held, every post
 * held or none in Default). Returns how many did not decode. */
unsigned shift_dqp_native_fill(struct shift_dqp *d, uint64_t send_from, uint64_t recv_from);

/* Is an entry among the outstanding ones still native (its WQE unread)?
 * (post_lock held, mirror synced) */
bool shift_dqp_native_unread(struct shift_dqp *d);

#endif /* SHIFT_DP_NWQ_H */
