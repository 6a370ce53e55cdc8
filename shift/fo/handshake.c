/*
 * The two-way handshake on the backup QPs and what follows it: the peer's
 * receive counter says which outstanding sends it executed already (they
 * complete without being sent again); the rest are retransmitted on the
 * backup QP, in order.
 */
#include "shift/fo/fo_int.h"

/*
 * The outstanding send WRs (sq synced) that the peer has executed, by its
 * receive counter (compared under mask, the bits the counter carries): my
 * consumers done before them plus those among them make the counter, so
 * they end with the peer_count - done -th consumer: returns the index after
 * it (sq_tail if none). *rd is the first RDMA READ among them (UINT64_MAX if
 * none), *done_out my consumers done before them.
 */
uint64_t fo_executed_end(struct shift_dqp *d, uint32_t peer_count, uint32_t mask,
			     uint64_t *rd, uint32_t *done_out)
{
	uint64_t outstanding_consumers = 0, skip, end;

	for (uint64_t i = d->sq_tail; i < d->sq_head; i++)
		outstanding_consumers += shift_wr_consumes_recv(shift_dqp_swqe(d, i)->opcode);
	uint32_t done = (uint32_t)(shift_dqp_consumers_posted(d) - outstanding_consumers) & mask;

	skip = (peer_count - done) & mask;
	shift_debug("%s QP %u: peer counter %u, mine: %u done, %llu outstanding consumers", d->dev,
		    d->qpn, peer_count, done, (unsigned long long)outstanding_consumers);
	if (skip > outstanding_consumers) {
		shift_warn("%s QP %u: the peer's receive counter (%u) is ahead of what was sent; "
			   "sending everything again", d->dev, d->qpn, peer_count);
		skip = 0;
	}
	*rd = UINT64_MAX;
	for (end = d->sq_tail; skip && end < d->sq_head; end++) {
		struct shift_swqe *e = shift_dqp_swqe(d, end);

		if (shift_wr_consumes_recv(e->opcode))
			skip--;
		if (e->opcode == IBV_WR_RDMA_READ && *rd == UINT64_MAX)
			*rd = end;
	}
	if (done_out)
		*done_out = done;
	return end;
}

/* Mirrored send WR i was executed at the peer, its ACK lost: its
 * completion, if signaled, without sending it again. */
void fo_complete_executed(struct shift_dqp *d, struct out *os, uint64_t i)
{
	struct shift_swqe *e = shift_dqp_swqe(d, i);

	if ((e->send_flags & IBV_SEND_SIGNALED) || d->sq_sig_all) {
		struct ibv_wc wc = {
			.wr_id = e->wr_id, .status = IBV_WC_SUCCESS,
			.opcode = fo_send_wc_opcode(e->opcode), .qp_num = d->qpn,
		};
		shift_dqp_retire(d, &wc); /* sq_tail follows at the next sync */
		fo_emit(os, &wc);
	}
}

/* Both messages exchanged: retransmit what the peer has not executed. */
void fo_retransmit(struct shift_dqp *d, struct out *o)
{
	uint64_t rd, i, t0 = shift_clock_us();
	/* executed at the peer, ACK lost: complete them, do not send again
	 * (on the send CQ: o may be the receive CQ's, when they differ) */
	struct out so = { .wc = NULL, .n = 0, .max = 0, .c = d->scq };
	struct out *os = o->c == d->scq ? o : &so;

	shift_dqp_sync(d);
	/* An RDMA READ among the executed WRs was executed, but its response
	 * may not have arrived: its data is not known to be here. From the
	 * first such READ on, the READs are sent again and the executed WRs
	 * after it are replaced by empty WRITEs (placeholders) on the backup,
	 * so every completion still comes in order. */
	uint64_t end = fo_executed_end(d, d->peer_recv_count, CTRL_COUNT(~0u), &rd, NULL);

	if (!fo_bk_carries(d, rd, end, true) || !fo_bk_carries(d, end, d->sq_head, false)) {
		/* (before any WR moved) */
		fo_fail_connection(d, o, "an outstanding WR uses a memory window or memory without "
				   "a backup", NULL, FO_TELL_PEER | FO_PATH_ERROR);
		return;
	}

	for (i = d->sq_tail; i < end && i < rd; i++)
		fo_complete_executed(d, os, i);
	unsigned long before = SHIFT_STAT(d->retransmitted);
	uint64_t skipped = end - d->sq_tail;

	struct fo_chain ch;
	int rc = 0;

	fo_chain_init(&ch, false);
	shift_dqp_lock(d);
	d->handshake_done = true;
	d->sq_held_exec = end; /* (if a WR is held for its key: fo_held_release) */
	d->sq_retx_end = d->sq_head;
	for (; !rc && i < end && !d->sq_held; i++) {
		bool again = shift_dqp_swqe(d, i)->opcode == IBV_WR_RDMA_READ;

		rc = again ? fo_chain_send(d, &ch, i) : fo_chain_placeholder(d, &ch, i);
		skipped -= again;
	}
	for (; !rc && i < d->sq_head && !d->sq_held; i++)
		rc = fo_chain_send(d, &ch, i);
	if (!rc)
		rc = fo_chain_flush(d, &ch);
	shift_dqp_unlock(d);
	if (rc) {
		fo_give_up_late(d, o, "cannot post a WR on the backup QP");
		return;
	}
	uint64_t now = shift_clock_us();

	/* its phases (fo_timing_say): the peer's message is used up here */
	d->retx_us = (uint32_t)(now - t0);
	d->start_us = d->t_sent_us > d->t_start_us ? (uint32_t)(d->t_sent_us - d->t_start_us) : 0;
	d->wait_us = d->t_peer_us > d->t_sent_us && d->t_sent_us ?
			     (uint32_t)(d->t_peer_us - d->t_sent_us) : 0;
	d->t_peer_us = 0;
	/* (WRs held for their keys: every WR is reposted once they go,
	 * fo_held_release) */
	/* (from the failover's start: the first error seen, or the message,
	 * the port's event or the refused post that started it) */
	uint64_t sw = now - d->t_start_us;

	d->switch_us = d->sq_held ? 0 : sw ? sw : 1;
	shift_info("%s QP %u: on backup QP %u (failover %lu): %lu WRs retransmitted, %llu already "
		   "executed at the peer completed, %s %llu us", d->dev, d->qpn, d->bk->qp_num,
		   d->failovers, SHIFT_STAT(d->retransmitted) - before, (unsigned long long)skipped,
		   d->sq_held ? "the rest held for the peer's backup keys after" : "switch time",
		   (unsigned long long)sw);
	fo_timing_say(d);
}

/* The peer's handshake message arrived for d. */
void fo_on_ctrl(struct shift_ctx *s, struct shift_dqp *d, struct out *o)
{
	d->ctrl_pending = false;
	if (d->peer_recv_count & CTRL_ABORT) {
		/* (an atomic in flight there, or it gave up) */
		fo_fail_connection(d, o, "the peer's side of the connection failed (ABORT)", NULL, 0);
		return;
	}
	/* (my own failover now; it may find the QP failed for the
	 * application's error instead, or unable to follow (a QP on an SRQ
	 * that cannot move): then the answer below, or the peer would wait
	 * for ever) */
	if (shift_dqp_send_state(d) == SHIFT_SEND_DEFAULT && fo_start(s, d, o, NULL) &&
	    shift_dqp_send_state(d) != SHIFT_SEND_UNPROTECTED)
		return;
	if (shift_dqp_send_state(d) == SHIFT_SEND_UNPROTECTED) {
		fo_tell_abort(d); /* (the peer waits for my answer) */
		return;
	}
	/* waiting for the peer's backup: its message proves it is ready */
	if (shift_dqp_send_state(d) != SHIFT_SEND_UNPROTECTED && !d->ctrl_sent)
		fo_send_my_ctrl(s, d);
	if (fo_fail_pending(d, o))
		return;
	if (shift_dqp_send_state(d) != SHIFT_SEND_UNPROTECTED && !d->handshake_done)
		fo_retransmit(d, o);
}
