/*
 * Failing back to the recovered default NIC (SHIFT paper §4.3.3): resetting
 * and probing the default QP, the fence (WaitSignaled, WaitDrained), the
 * failback notification and moving receives back.
 */
#include "shift/fo/fo_int.h"

/* ---- failing back (SHIFT paper §4.3.3) ------------------------------------
 *
 * The background thread resets a failed default QP to the attributes the
 * application gave it (PSNs advanced by the connection's failover count,
 * the same at both ends) once its port is ACTIVE again, posts SHIFT's
 * receive for the peer's notification and probes the path with an empty
 * RDMA WRITE. A probe that fails leaves the QP in ERR: reset and probe
 * again later (backoff). A probe that succeeds moves the send side to
 * WaitSignaled: the next signaled WR (or the last outstanding one, if
 * signaled) is the fence; WRs posted after it are held in the mirror
 * (WaitDrained) until it completes on the backup, then a notification
 * (WRITE_WITH_IMM carrying my receive-consumer count) goes out on the
 * default QP, followed by the held WRs: send state Default. The peer, on
 * the notification, waits until its backup receive completions reach that
 * count and reposts its remaining receives on its default QP (receive
 * state Default). Once both directions are back, the backup QP (stale
 * receives, consumed control receive) is reset and reconnected.
 */

/* 1: the port is ACTIVE, 0: it is not, -1: it cannot be queried. */
int fo_port_state(struct shift_ctx *s, unsigned port)
{
	struct ibv_port_attr pa;

	memset(&pa, 0, sizeof(pa));
	if (shift_lower->query_port(s->ibctx, (uint8_t)port, &pa))
		return -1;
	return pa.state == IBV_PORT_ACTIVE;
}

bool fo_port_active(struct shift_ctx *s, struct shift_dqp *d)
{
	uint8_t port = d->shadow && d->shadow->attr.port_num ? d->shadow->attr.port_num : 1;

	return fo_port_state(s, port) == 1;
}

/* The backup QP's port (the default QP's number, on the backup NIC). */
bool fo_bk_port_active(struct shift_ctx *s, struct shift_dqp *d)
{
	struct ibv_port_attr pa;
	uint8_t port = d->shadow && d->shadow->attr.port_num ? d->shadow->attr.port_num : 1;

	if (s->rnic)
		port = shift_rnic_bk_port(s->rnic, port);
	memset(&pa, 0, sizeof(pa));
	return s->rnic && s->rnic->bk_ctx && !shift_lower->query_port(s->rnic->bk_ctx, port, &pa) &&
	       pa.state == IBV_PORT_ACTIVE;
}

int fo_reset_default(struct shift_ctx *s, struct shift_dqp *d)
{
	struct shift_rnic *r = s->rnic;
	struct ibv_qp_attr app;
	struct ibv_recv_wr rwr = { .wr_id = shift_dqp_own_wrid(d, SHIFT_OWN_CTRL_RECV) }, *rbad;
	uint32_t off = (uint32_t)d->failovers * 0x9e3779u;
	const int need = IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS | IBV_QP_AV |
			 IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN;
	int mask;

	pthread_mutex_lock(&r->lock);
	app = d->shadow->attr;
	mask = d->shadow->attr_mask;
	pthread_mutex_unlock(&r->lock);
	if ((mask & need) != need)
		return -1;
	/* (a QP on an SRQ reads the default SRQ again only once SHIFT has
	 * consumed the WQEs there whose buffers the backup path filled) */
	if (d->dsrq && shift_dsrq_moved(d->dsrq))
		return -1;
	if (shift_qp_reset(d->qp) || shift_qp_to_init(d->qp, &app, app.port_num))
		return -1;
	d->dflt_path_err = false;
	d->port_was_down = false; /* (a fresh QP: its failures are new ones) */
	/* the peer's failback notification consumes this, ahead of the
	 * application's receives reposted after it (on an SRQ: the first
	 * receive the QP consumes, fo/srq.c) */
	if (d->dsrq)
		fo_srq_expect_notify(d);
	else if (d->prov_post_recv(d->qp, &rwr, &rbad))
		return -1;
	d->ctrl_recv_out = true;
	if (shift_qp_to_rtr(d->qp, &app, mask, &app.ah_attr, app.path_mtu, app.dest_qp_num,
			    app.rq_psn + off))
		return -1;
	if (!(mask & IBV_QP_SQ_PSN))
		return 1; /* the application left it at RTR: so does SHIFT */
	return shift_qp_to_rts(d->qp, &app, mask, app.sq_psn + off) ? -1 : 0;
}

/*
 * One end of a connection probes: the one whose default (GID, QPN) is the
 * lower, unless its application never sends. The other end resets its
 * default QP once per failover and keeps it receptive; the prober's
 * failback notification proves the path to it, and it switches its sends
 * back then. Two probers would each reset their QP after a failed probe,
 * re-basing its PSNs under the other's probe, notification or held WRs:
 * the two ends' resets are not coordinated, the prober's alone are safe
 * (its probe is the only packet it sends before one is acknowledged, so
 * the receptive end is never more than that one packet ahead of it).
 */
bool fo_prober(struct shift_dqp *d)
{
	const struct shift_qp_key *me = &d->shadow->my_key, *peer = &d->shadow->peer_key;
	int c;

	if (d->peer_nosend)
		return true;
	c = memcmp(me->gid.raw, peer->gid.raw, sizeof(me->gid.raw));
	return c < 0 || (c == 0 && me->qpn < peer->qpn);
}

int fo_post_probe(struct shift_dqp *d)
{
	struct ibv_send_wr wr, *bad;

	if (d->dflt_rd_stale) {
		/* an empty READ: its response is the only one a completer
		 * left inside a read response accepts (stale_read_state) */
		fo_empty_read(&wr, shift_dqp_own_wrid(d, SHIFT_OWN_PROBE), IBV_SEND_SIGNALED);
		return d->prov_post_send(d->qp, &wr, &bad);
	}
	memset(&wr, 0, sizeof(wr));
	wr.wr_id = shift_dqp_own_wrid(d, SHIFT_OWN_PROBE);
	wr.opcode = IBV_WR_RDMA_WRITE;
	wr.send_flags = IBV_SEND_SIGNALED;
	return d->prov_post_send(d->qp, &wr, &bad);
}

/* My outstanding receives go to the default QP, as the application posted
 * them: receive state Default. post_lock held. 0, or -1 (given up:
 * fo_fail_mark, the caller fails the connection once it unlocks). */
int fo_receives_back(struct shift_dqp *d)
{
	for (uint64_t i = SHIFT_LOAD(d->rq_tail); i < d->rq_head; i++) {
		struct shift_rwqe *e = shift_dqp_rwqe(d, i);
		struct ibv_recv_wr wr = { .wr_id = e->wr_id, .sg_list = e->sge,
					  .num_sge = (int)e->num_sge }, *bad;

		int rc = d->prov_post_recv(d->qp, &wr, &bad);

		if (rc && fo_take_refused(d, rc, d->sq_head, i)) {
			/* it failed again: the next failover reposts them */
			shift_info("%s QP %u: the default QP failed again while my receives moved back",
				   d->dev, d->qpn);
			break;
		}
		if (rc) {
			/* (those before it are on the default QP) */
			fo_fail_mark(d, "the default QP refused a receive while failing back",
				     FO_BY_STATE, i);
			return -1;
		}
	}
	shift_dqp_set_recv_state(d, SHIFT_RECV_DEFAULT, "receives back on the default QP");
	if (d->dsrq)
		fo_srq_release(d); /* (what its reset default QP received meanwhile) */
	return 0;
}

/* The default path failed again before the switch: the WRs held for it go
 * to the backup after all. post_lock held (a give-up: fo_fail_mark). */
static void fallback_again(struct shift_dqp *d)
{
	uint64_t first = shift_dqp_send_state(d) == SHIFT_SEND_WAIT_DRAINED ? d->fence + 1 : d->sq_head;

	shift_dqp_set_send_state(d, SHIFT_SEND_FALLBACK, "the default path failed again");
	d->dflt = SHIFT_DFLT_ERR;
	d->probe_at = shift_clock_ms() + fo_probe_wait(d);
	for (uint64_t i = first; i < d->sq_head; i++) {
		int rc = fo_post_bk_send(d, i);

		if (rc == FO_BK_REFUSED) {
			fo_bk_refused(d); /* (the rest held for the next episode) */
			return;
		}
		if (rc) {
			fo_fail_mark(d, "cannot post a WR on the backup QP", FO_BY_STATE, FO_BY_STATE);
			return;
		}
	}
}

/* Send side back to the default QP: the notification, then the held WRs.
 * post_lock held. */
void fo_switch_back(struct shift_dqp *d)
{
	uint64_t first = shift_dqp_send_state(d) == SHIFT_SEND_WAIT_DRAINED ? d->fence + 1 : d->sq_head;
	uint64_t held = 0, i;
	struct ibv_send_wr wr, *bad;

	for (i = first; i < d->sq_head; i++)
		held += shift_wr_consumes_recv(shift_dqp_swqe(d, i)->opcode);
	memset(&wr, 0, sizeof(wr));
	wr.wr_id = shift_dqp_own_wrid(d, SHIFT_OWN_NOTIFY);
	wr.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
	/* signaled: the QP stays in the slow path until its completion is
	 * filtered out (an unsignaled one still completes if flushed) */
	wr.send_flags = IBV_SEND_SIGNALED;
	wr.imm_data = htobe32(CTRL_COUNT((uint32_t)(shift_dqp_consumers_posted(d) - held)));
	struct ibv_send_wr rd, *first_wr = &wr;
	if (d->dflt_rd_stale) {
		/* the notification's ACK would fail the QP (stale_read_state):
		 * an empty READ goes first (unsignaled: only its failure
		 * completes, as the notification's) */
		fo_empty_read(&rd, shift_dqp_own_wrid(d, SHIFT_OWN_NOTIFY_READ), 0);
		rd.next = &wr;
		first_wr = &rd;
	}
	if (d->prov_post_send(d->qp, first_wr, &bad)) {
		shift_info("%s QP %u: default QP refused the failback notification: staying on the backup",
			   d->dev, d->qpn);
		fallback_again(d);
		return;
	}
	/* the held WRs (and those posted meanwhile) wait for its completion
	 * (SHIFT paper 4.3.3): it is executed at the peer before any of them */
	d->notify_inflight = true;
	d->notify_sent = true;
	d->fence = first - 1;
	shift_dqp_set_send_state(d, SHIFT_SEND_WAIT_DRAINED, "fence posted");
}

/* My notification completed: the held WRs go to the default QP, in order,
 * and the send side is back (Default). post_lock held (a give-up:
 * fo_fail_mark). */
static void notified(struct shift_dqp *d)
{
	uint64_t first = d->fence + 1;
	struct fo_chain ch;
	int rc = 0;

	/* (as chains: one doorbell per post) */
	fo_chain_init(&ch, true);
	for (uint64_t i = first; !rc && i < d->sq_head; i++)
		rc = fo_chain_default(d, &ch, i);
	if (!rc)
		rc = fo_chain_flush(d, &ch);
	if (rc && ch.rc && fo_take_refused(d, ch.rc, ch.failed, d->rq_head)) {
		/* it failed again: the next failover retransmits them */
		shift_info("%s QP %u: the default QP failed again while my held WRs moved back",
			   d->dev, d->qpn);
	} else if (rc) {
		/* (those before it are on the default QP) */
		fo_fail_mark(d, "the default QP refused a WR while failing back", ch.failed,
			     FO_BY_STATE);
		return;
	}
	shift_dqp_set_send_state(d, SHIFT_SEND_DEFAULT, "failback done");
	SHIFT_STAT_ADD(d->failbacks, 1);
	d->failback_fails = 0;
	bool rd = d->dflt_rd_stale;

	d->dflt_rd_stale = false; /* an empty READ or the probe went first */
	SHIFT_STAT_SET(d->last_switch_s, shift_clock_wall_s());
	/* a receive-only peer sends nothing, no notification either */
	if (d->peer_nosend && shift_dqp_recv_state(d) == SHIFT_RECV_FALLBACK)
		fo_receives_back(d);
	shift_info("%s QP %u: sends back on the default QP (%llu held WRs posted there; failback %lu%s)",
		   d->dev, d->qpn, (unsigned long long)(d->sq_head - first), d->failbacks,
		   rd ? "; an empty READ went ahead of the notification" : "");
}

/* The probe came back: the default path works in both directions. */
static void probe_ok(struct shift_dqp *d, const char *how)
{
	d->dflt = SHIFT_DFLT_OK;
	d->probe_fails = 0;
	shift_info("%s QP %u: default path answers again (%s)", d->dev, d->qpn, how);
	shift_dqp_lock(d);
	if (shift_dqp_send_state(d) == SHIFT_SEND_FALLBACK) {
		shift_dqp_sync_locked(d);
		if (d->sq_tail == d->sq_head) {
			fo_switch_back(d);
		} else if (shift_dqp_signaled(d, d->sq_head - 1) && !d->sq_held) {
			/* the last outstanding WR is signaled: it is the fence
			 * (not one held for its key: never posted, it would
			 * never drain; fo_held_release() picks the fence then) */
			d->fence = d->sq_head - 1;
			shift_dqp_set_send_state(d, SHIFT_SEND_WAIT_DRAINED, "fence posted");
		} else {
			shift_dqp_set_send_state(d, SHIFT_SEND_WAIT_SIGNALED, "failback: waiting for a signaled WR");
		}
	}
	shift_dqp_unlock(d);
	fo_fail_pending(d, NULL); /* (the switch back gave up) */
}

/* The peer's notification arrived on my default QP: once its backup sends
 * are all accounted for, my remaining receives move to the default QP. */
void fo_try_notify(struct shift_dqp *d)
{
	/* (on an SRQ the peer's later sends may be received already) */
	uint32_t counted = d->dsrq ? fo_srq_counted(d) : (uint32_t)SHIFT_LOAD(d->rq_tail);
	uint32_t behind = CTRL_COUNT(d->notify_count - counted);

	if (!d->notify_pending)
		return;
	if (behind && behind < (1u << 29))
		return; /* backup receive completions still to come */
	if (d->dsrq && fo_srq_waits(d))
		return; /* (on an SRQ: ... and handed out, fo/srq.c) */
	if (behind)
		shift_warn("%s QP %u: consumed more receives (%u) than the peer sent on the backup (%u)",
			   d->dev, d->qpn, CTRL_COUNT((uint32_t)SHIFT_LOAD(d->rq_tail)), d->notify_count);
	shift_dqp_lock(d);
	int rc = fo_receives_back(d);
	uint64_t tail = __atomic_load_n(&d->rq_tail, __ATOMIC_RELAXED);
	/* (rq_head is the posters': read under their lock) */
	unsigned long long moved = d->rq_head > tail ? d->rq_head - tail : 0;

	d->notify_pending = false;
	shift_dqp_unlock(d);
	if (rc) {
		fo_fail_pending(d, NULL);
		return;
	}
	shift_info("%s QP %u: receives back on the default QP (%llu reposted)", d->dev, d->qpn,
		   moved);
}

/*
 * My failback notification failed. The peer may have executed it (its ACK
 * lost) and moved its receives: only a new failover on reset backups is
 * safe. A flush says only that my QP went to ERR, and the drain judges why
 * (fo_judge_start), as for a flush seen first: a bad request of the peer's
 * application (IBA class C) does it with no error completion of its own,
 * an error of a receive of mine with one. With no sign of a path failure
 * and the device up, the connection fails for the application as plain's
 * would, where a new failover hid the error.
 */
static void notify_failed(struct shift_ctx *s, struct shift_dqp *d, const struct ibv_wc *wc,
			  struct out *o)
{
	if (d->failback_fails < 64)
		d->failback_fails++;
	shift_info("%s QP %u: failback notification failed (%d): the default path failed again "
		   "(next probe in %llu %s)", d->dev, d->qpn, (int)wc->status,
		   (unsigned long long)fo_probe_wait(d), "ms");
	if (shift_dqp_send_state(d) != SHIFT_SEND_WAIT_DRAINED)
		return;
	/* (behind an empty READ, dflt_rd_stale: a flush is also what rxe's
	 * stale read-response state gives when that READ's request or
	 * response was lost, a path matter) */
	if (wc->status == IBV_WC_WR_FLUSH_ERR && !d->dflt_rd_stale)
		fo_start_unsure(s, d, o, NULL);
	else
		fo_start(s, d, o, NULL);
}

/* An empty READ completed. A return's (fo/return.c, stale_read_first):
 * done, the return finishes (the peer's return record was read), with no
 * wait for another read of it; failed, the default path failed too
 * (flushed by a new failover's stop: that one's, no longer the return's).
 * True for it, else for a success only. */
static bool ret_read_done(struct shift_ctx *s, struct shift_dqp *d, const struct ibv_wc *wc,
			  struct out *o)
{
	if (!d->ret_rd_wait)
		return wc->status == IBV_WC_SUCCESS;
	d->ret_rd_wait = false;
	if (d->ep_wait != SHIFT_EP_WAIT_RETURN)
		return true;
	if (wc->status == IBV_WC_SUCCESS) {
		d->dflt_rd_stale = false;
		fo_ret_finish(s, d, o);
	} else {
		fo_fail_connection(d, o, "the default path failed during the return to it", NULL, 0);
	}
	return true;
}

/* SHIFT's own completions on a default QP that has failed over. */
void fo_on_default_ctrl(struct shift_ctx *s, struct shift_dqp *d, struct ibv_wc *wc,
			    struct out *o)
{
	switch (shift_dqp_own_kind(d, wc->wr_id)) {
	case SHIFT_OWN_PROBE:
		/* (a probe that completed before the QP was stopped for a new
		 * failover, drained after it: that QP answers nothing now; a
		 * QP on an SRQ is stopped so whenever a sibling fails over) */
		if (d->dflt != SHIFT_DFLT_PROBING)
			return;
		if (wc->status == IBV_WC_SUCCESS) {
			bool rd = d->dflt_rd_stale;

			d->dflt_rd_stale = false; /* (an empty READ, if it was) */
			probe_ok(d, rd ? "probe, an empty READ" : "probe");
		} else {
			d->dflt = SHIFT_DFLT_ERR;
			d->probe_fails++;
			d->probe_at = shift_clock_ms() + fo_probe_wait(d);
			shift_debug("%s QP %u: probe failed (%d)", d->dev, d->qpn, (int)wc->status);
		}
		return;
	case SHIFT_OWN_CTRL_RECV:
		d->ctrl_recv_out = false;
		if (wc->status != IBV_WC_SUCCESS && wc->status != IBV_WC_WR_FLUSH_ERR)
			shift_debug("%s QP %u: SHIFT's receive on the default QP failed: %d (opcode %d)",
				    d->dev, d->qpn, (int)wc->status, (int)wc->opcode);
		if (wc->status != IBV_WC_SUCCESS || shift_dqp_recv_state(d) != SHIFT_RECV_FALLBACK)
			return; /* flushed by a failed probe */
		if (!d->handshake_done) {
			/* the peer's failback of the previous failover, taken
			 * from the default CQ after a new one started here: that
			 * one's handshake moves my receives, not this */
			shift_debug("%s QP %u: the peer's failback notification of failover %lu "
				    "ignored: failover %lu has started", d->dev, d->qpn,
				    d->failovers - 1, d->failovers);
			return;
		}
		d->notify_count = CTRL_COUNT(be32toh(wc->imm_data));
		/* (under post_lock: a receive posted now reads it there, and is
		 * held or on the backup QP, as one posted just before) */
		shift_dqp_lock(d);
		d->notify_pending = true;
		shift_dqp_unlock(d);
		/* the prober's notification came over the default path: it
		 * works both ways (its ACK went back), my sends may follow */
		if (shift_dqp_send_state(d) == SHIFT_SEND_FALLBACK && d->handshake_done &&
		    d->dflt == SHIFT_DFLT_READY && !fo_prober(d))
			probe_ok(d, "the peer's failback notification");
		if (d->rcq)
			fo_poll_backup(s, d->rcq, o, false);
		fo_try_notify(d);
		return;
	case SHIFT_OWN_NOTIFY_READ:
		if (ret_read_done(s, d, wc, o))
			return; /* (a return's, or a QP that signals all WRs) */
		/* fall through - its failure is the notification's */
	default: /* the notification's own completion */
		if (!d->notify_inflight)
			return;
		d->notify_inflight = false;
		if (wc->status == IBV_WC_SUCCESS) {
			shift_dqp_lock(d);
			if (shift_dqp_send_state(d) == SHIFT_SEND_WAIT_DRAINED)
				notified(d);
			shift_dqp_unlock(d);
			fo_fail_pending(d, o);
			return;
		}
		notify_failed(s, d, wc, o);
		return;
	}
}
