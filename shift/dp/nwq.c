/*
 * Native work-queue access (nwq.h): a QP's native setup and the decoding of
 * native entries at a failover.
 */
#include "shift/dp/nwq.h"
#include "shift/dp/ctx.h"

void shift_dqp_set_native(struct shift_dqp *d, struct shift_nwq *q)
{
	d->nwq = q;
	d->sq_dbrec = q->sq_dbrec;
	d->rq_dbrec = q->rq_cnt ? q->rq_dbrec : NULL;
}

unsigned shift_dqp_native_fill(struct shift_dqp *d, uint64_t send_from, uint64_t recv_from)
{
	const struct shift_nwq *q = d->nwq;
	unsigned bad = 0;
	unsigned long good = 0;

	if (!q)
		return 0;
	for (uint64_t i = send_from; i < d->sq_head; i++) {
		struct shift_swqe *e = shift_dqp_swqe(d, i);

		if (e->num_sge != SHIFT_WQE_NATIVE)
			continue;
		if (q->read_send(q, e->imm, e, d->max_send_sge, d->max_inline))
			bad++;
		else
			good++;
	}
	for (uint64_t i = recv_from; q->rq_cnt && i < d->rq_head; i++) {
		struct shift_rwqe *e = shift_dqp_rwqe(d, i);

		if (e->num_sge != SHIFT_WQE_NATIVE)
			continue;
		if (q->read_recv(q, e->pad, e, d->max_recv_sge))
			bad++;
		else
			good++;
	}
	__atomic_fetch_add(&shift_stats.wqes_read_back, good, __ATOMIC_RELAXED);
	__atomic_fetch_add(&shift_stats.wqes_unreadable, bad, __ATOMIC_RELAXED);
	return bad;
}

bool shift_dqp_native_unread(struct shift_dqp *d)
{
	if (!d->nwq)
		return false;
	for (uint64_t i = d->sq_tail; i < d->sq_head; i++)
		if (shift_dqp_swqe(d, i)->num_sge == SHIFT_WQE_NATIVE)
			return true;
	for (uint64_t i = __atomic_load_n(&d->rq_tail, __ATOMIC_RELAXED); i < d->rq_head; i++)
		if (shift_dqp_rwqe(d, i)->num_sge == SHIFT_WQE_NATIVE)
			return true;
	return false;
}
