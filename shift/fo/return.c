/*
 * Return episodes: the backup path failed while the default path works
 * again. Both ends go back to their default QPs, with the handshake (each
 * end's receive counter) carried by the KV store.
 */
#include "shift/fo/fo_int.h"

/* ---- return episodes ----------------------------------------------------------
 *
 * The backup path fails while the default path works again (the backup NIC
 * dies during a failback): WRs on the backup QP (up to the fence, behind
 * which the rest is held) would never complete, and a new failover onto
 * the dead backup cannot help. Both ends go back to their default QPs
 * instead, with the failover's handshake carried by the KV store (the
 * backup path is gone, and a message on the default path could land in an
 * application receive):
 *
 * - fo_ret_start(): the end that sees its backup fail with its default path
 *   proven (its probe answered), or that reads the peer's return record,
 *   stops its backup QP (its successful completions kept), reposts its
 *   outstanding receives on the default QP, and publishes failover k+1 as
 *   a return, with its receive counter.
 * - fo_ret_finish(): once the peer's return record for k+1 is read, its
 *   receives are on its default QP: my sends that were on the backup or
 *   held go to the default QP, those the peer's counter shows executed
 *   completed instead, as in fo_retransmit(). If my failback notification has
 *   not consumed the peer's control receive (posted at its default reset,
 *   at the head of its receive queue), an empty WRITE_WITH_IMM goes first
 *   to consume it.
 *
 * The backup is re-armed later as after a failback. An atomic among the WRs
 * to move fails the connection, as in a failover.
 */
int fo_ret_start(struct shift_ctx *s, struct shift_dqp *d, struct out *o)
{
	if (d->dflt == SHIFT_DFLT_ERR) {
		/* (the follower: its default QP must take the WRs) */
		int rc = fo_reset_default(s, d);

		if (rc < 0)
			return -1;
		d->dflt = SHIFT_DFLT_READY;
	}
	d->ret_rd_wait = false;
	shift_dqp_lock(d);
	d->recv_hold = true;
	if (shift_dqp_send_state(d) != SHIFT_SEND_DEFAULT) {
		d->handshake_done = false; /* sends held until fo_ret_finish() */
		shift_dqp_set_send_state(d, SHIFT_SEND_FALLBACK, "return episode");
	}
	shift_dqp_unlock(d);
	/* the backup's successful completions first, its errors dropped */
	fo_flush_backup(s, d, true);
	d->bk_error = false;
	__atomic_store_n(&d->bk_refused, false, __ATOMIC_RELEASE); /* (fo_bk_refused) */
	if (d->ep_wait == SHIFT_EP_WAIT_PEER || d->ep_wait == SHIFT_EP_WAIT_RESET)
		shift_dqp_set_ep_wait(d, SHIFT_EP_RUNNING, "return episode");
	d->notify_pending = false;
	shift_dqp_sync(d);
	for (uint64_t i = d->sq_tail; i < d->sq_head && shift_dqp_send_state(d) != SHIFT_SEND_DEFAULT; i++) {
		if (shift_wr_is_atomic(shift_dqp_swqe(d, i)->opcode)) {
			d->atomic_boundary_hit = true;
			d->recv_hold = false;
			fo_fail_connection(d, o, "an atomic was in flight on the failed backup", NULL, 0);
			return -2;
		}
	}
	shift_dqp_lock(d);
	int rc = shift_dqp_recv_state(d) == SHIFT_RECV_FALLBACK ? fo_receives_back(d) : 0;

	d->recv_hold = false;
	shift_dqp_unlock(d);
	if (rc) {
		fo_fail_pending(d, o);
		return -1;
	}
	SHIFT_STAT_ADD(d->failovers, 1);
	shift_dqp_set_ep_wait(d, SHIFT_EP_WAIT_RETURN, "return episode: the peer's counter");
	d->ret_ep = d->failovers;
	d->ret_count = (uint32_t)SHIFT_LOAD(d->rq_tail);
	d->wait_since = shift_clock_ms();
	d->kv_at = 0;
	SHIFT_STAT_SET(d->last_switch_s, shift_clock_wall_s());
	fo_ep_publish(s, d);
	shift_info("%s QP %u: the backup path failed, the default path works: back to the default "
		   "QP (failover %lu, receive counter %u)", d->dev, d->qpn, d->failovers,
		   (uint32_t)SHIFT_LOAD(d->rq_tail));
	return 0;
}

/*
 * My default QP, reset, may have stopped inside a read response: the
 * first ACK or NAK of any other WR fails it, silently (stale_read_state,
 * fo/failback.c). An empty READ goes first, alone and signaled as the
 * prober's probe: chained before the WRs, its request or response lost
 * and the ACK (or NAK) of a WR behind it failed the QP all the same. Its
 * completion finishes the return (fo/failback.c, ret_read_done); no probe
 * runs meanwhile (fo/work.c). True while the return waits for it, or if
 * the connection failed.
 */
static bool stale_read_first(struct shift_dqp *d, struct out *o)
{
	struct ibv_send_wr er, *bad_er;

	if (d->ret_rd_wait)
		return true;
	if (!d->dflt_rd_stale)
		return false;
	fo_empty_read(&er, shift_dqp_own_wrid(d, SHIFT_OWN_NOTIFY_READ), IBV_SEND_SIGNALED);
	shift_dqp_lock(d);
	int rc = d->prov_post_send(d->qp, &er, &bad_er);

	shift_dqp_unlock(d);
	if (rc)
		fo_fail_connection(d, o, "the default QP refused a WR of the return", NULL, 0);
	else
		d->ret_rd_wait = true;
	return true;
}

void fo_ret_finish(struct shift_ctx *s, struct shift_dqp *d, struct out *o)
{
	uint64_t moved = 0, done_n = 0;

	(void)s;

	if (stale_read_first(d, o))
		return;
	if (d->ep_wait == SHIFT_EP_WAIT_RETURN)
		shift_dqp_set_ep_wait(d, SHIFT_EP_RUNNING, "return episode done");
	shift_dqp_lock(d);
	if (shift_dqp_send_state(d) != SHIFT_SEND_DEFAULT) {
		uint64_t rd, i;
		uint32_t done;
		struct out so = { .wc = NULL, .n = 0, .max = 0, .c = d->scq };
		struct out *os = o->c == d->scq ? o : &so;

		shift_dqp_sync_locked(d);
		uint64_t end = fo_executed_end(d, d->peer_ret_count, ~0u, &rd, &done);

		if (!d->notify_sent) {
			/* the peer's control receive heads its queue: consume it */
			struct ibv_send_wr wr, *bad;

			memset(&wr, 0, sizeof(wr));
			wr.wr_id = shift_dqp_own_wrid(d, SHIFT_OWN_NOTIFY);
			wr.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
			wr.imm_data = htobe32(CTRL_COUNT(done));
			if (d->prov_post_send(d->qp, &wr, &bad))
				shift_warn("%s QP %u: cannot post the marker on the default QP", d->dev,
					   d->qpn);
			d->notify_sent = true;
		}
		if (rd < end) {
			/* an RDMA READ executed before a consumer the peer has,
			 * its response maybe lost: sent again it would complete
			 * after that consumer (fo_retransmit() keeps the order with
			 * placeholders on the backup, gone here) */
			shift_dqp_unlock(d);
			fo_fail_connection(d, o, "an RDMA READ may have lost its response", NULL, 0);
			return;
		}
		for (i = d->sq_tail; i < end; i++, done_n++)
			fo_complete_executed(d, os, i);
		for (; i < d->sq_head; i++) {
			int rc = fo_post_mirrored(d, i, true);

			if (rc && fo_take_refused(d, rc, i, d->rq_head))
				break; /* it failed again: the next failover */
			if (rc) {
				/* (those before it are on the default QP) */
				fo_fail_mark(d, "the default QP refused a WR", i, FO_BY_STATE);
				shift_dqp_unlock(d);
				fo_fail_pending(d, o);
				return;
			}
			moved++;
		}
		d->handshake_done = true;
		d->fence = 0;
		shift_dqp_set_send_state(d, SHIFT_SEND_DEFAULT, "return episode done");
	}
	shift_dqp_unlock(d);
	d->dflt = SHIFT_DFLT_OK;
	SHIFT_STAT_ADD(d->failbacks, 1);
	d->failback_fails = 0;
	d->switch_us = d->t_error_us ? shift_clock_us() - d->t_start_us : 0; /* (from the start) */
	SHIFT_STAT_SET(d->last_switch_s, shift_clock_wall_s());
	shift_info("%s QP %u: back on the default QP after the backup failed (failover %lu): %llu "
		   "WRs moved there, %llu already executed at the peer completed", d->dev, d->qpn,
		   d->failovers, (unsigned long long)moved, (unsigned long long)done_n);
}
