/*
 * The application's own errors and its own end of a connection, at any
 * state of the failover machine (docs/failover.md, "Error classification").
 *
 * An error completion of a protected QP starts a failover only if the path
 * failed (shift/dp/errclass.h). An error the application caused, or its
 * peer's application, reaches it exactly as without SHIFT: the provider's
 * own completion, then the provider's flushes, unfiltered; the QP stays in
 * ERR and SHIFT stops protecting it (Unprotected, final; its backup QP is
 * parked, and a peer that starts a failover towards it is answered ABORT).
 *
 * A flush seen first has no class of its own: the QP's first error decides
 * (it may be on the QP's other CQ, which is then looked at), or a failure
 * of one of SHIFT's own WRs on the default QP. With neither, the QP went to
 * ERR while its device works: the responder side of a bad request of the
 * peer's application (IBA class C: a remote access or invalid request
 * moves the responder's QP to ERR too, and rxe and mlx5 then flush its
 * receives with no error completion of its own), or a catastrophic error
 * of that QP. Neither is the path: the application's, as without SHIFT.
 * With the device gone (its port not ACTIVE, or not queryable) the flush
 * is the path's.
 *
 * The application's ibv_modify_qp to ERR or RESET ends protection from any
 * state (fo_end): the WRs SHIFT holds or has on the backup QP complete with
 * a flush error after the backup's successes (ERR) or vanish (RESET), as
 * the provider treats the WRs it has itself.
 */
#include "shift/fo/fo_int.h"

/* d's QP failed with nothing for SHIFT to hide, its send state Default:
 * from now on its completions are the application's as they come. The
 * provider has every WR but those SHIFT took from a refused post, which
 * complete with a flush error after the provider's own. */
static void unprotect(struct shift_ctx *s, struct shift_dqp *d, struct out *o,
		      const struct ibv_wc *wc, const char *why)
{
	shift_info("%s QP %u: %s (status %d, wr %#llx): passed to the application; the QP is no "
		   "longer protected", d->dev, d->qpn, why, (int)wc->status,
		   (unsigned long long)wc->wr_id);
	shift_dqp_lock(d);
	shift_dqp_set_send_state(d, SHIFT_SEND_UNPROTECTED, "the application's error");
	shift_dqp_unlock(d);
	if (d->shadow)
		__atomic_store_n(&d->app_error_end, true, __ATOMIC_RELEASE);
	shift_dqp_retire_app(d, wc); /* (an SRQ's receive is the application's) */
	fo_emit_after_srq(d, o, wc);
	if (d->post_failed) {
		shift_ctx_set_slow(s, true); /* (kept completions) */
		fo_drain_default(s, d->scq, o);
		if (d->rcq != d->scq)
			fo_drain_default(s, d->rcq, o);
		fo_flush_held(d, o, NULL, d->sq_taken, d->rq_taken);
	}
}

/*
 * The class of status on d's default QP. rxe completes a WR with
 * LOC_QP_OP_ERR when it cannot transmit because its netdev is down: with
 * d's port down (or seen down, or a path error of SHIFT's own WR before)
 * that is the path's failure, not the application's.
 */
enum shift_wc_class fo_wc_class(struct shift_dqp *d, enum ibv_wc_status status)
{
	enum shift_wc_class k = shift_wc_class(status);

	if (k == SHIFT_WC_APP && status == IBV_WC_LOC_QP_OP_ERR &&
	    (d->dflt_path_err || d->port_was_down ||
	     !fo_port_active(shift_ctx_of(d->qp->context), d)))
		return SHIFT_WC_PATH;
	return k;
}

/*
 * Why did d's QP flush with no error of its own seen before? PATH (start a
 * failover), APP, or OK: settled while looking at its other CQ (its first
 * error was there: d fails over, or is unprotected, now).
 */
static enum shift_wc_class flush_cause(struct shift_ctx *s, struct shift_dqp *d, struct out *o)
{
	struct shift_cq *other = o->c == d->scq ? d->rcq : d->scq;
	unsigned long failovers = d->failovers;

	if (d->dflt_path_err || d->port_was_down || !fo_port_active(s, d))
		return SHIFT_WC_PATH;
	if (d->cause_probe || !other || other == o->c)
		return SHIFT_WC_APP;
	/* the other queue's first error comes on the other CQ: take that
	 * CQ's completions through the usual filter (kept, in order) */
	shift_ctx_set_slow(s, true);
	d->cause_probe = true;
	fo_drain_default(s, other, o);
	d->cause_probe = false;
	if (shift_dqp_send_state(d) == SHIFT_SEND_UNPROTECTED || d->failovers != failovers)
		return SHIFT_WC_OK;
	return SHIFT_WC_APP;
}

/* A receive of d's SRQ that completed in error while d fails over: out of
 * the default SRQ, still the application's (as fo_from_default's flushes
 * of a QP already on its backup). */
static void srq_burned(struct shift_dqp *d, const struct ibv_wc *wc)
{
	if (d->dsrq && wc->status != IBV_WC_SUCCESS && (wc->opcode & IBV_WC_RECV))
		shift_dsrq_burned(d->dsrq, wc->wr_id);
}

/* The path failed under d: a failover (the former fo_from_default). */
static void path_failure(struct shift_ctx *s, struct shift_dqp *d, struct ibv_wc *wc,
			 struct out *o)
{
	shift_debug("%s QP %u: error completion %d (opcode %d, wr %#llx) starts a failover", d->dev,
		    d->qpn, (int)wc->status, (int)wc->opcode, (unsigned long long)wc->wr_id);
	int rc = fo_start(s, d, o, wc);

	if (rc == 0) {
		srq_burned(d, wc);
		if (d->ctrl_pending)
			fo_on_ctrl(s, d, o);
		return; /* the error itself is SHIFT's, not the application's */
	}
	if (rc == -2)
		return; /* the connection failed: wc was passed on with the flushes */
	shift_debug("%s QP %u: error %d passed to the application", d->dev, d->qpn, (int)wc->status);
	shift_dqp_retire_app(d, wc);
	fo_emit_after_srq(d, o, wc);
}

/* An error completion of protected QP d whose sends are on the default QP
 * (Default), or whose receives are back there while its sends are not. */
void fo_on_error(struct shift_ctx *s, struct shift_dqp *d, struct ibv_wc *wc, struct out *o)
{
	enum shift_wc_class k = fo_wc_class(d, wc->status);

	if (k == SHIFT_WC_FLUSH)
		k = flush_cause(s, d, o);
	if (k == SHIFT_WC_OK) {
		if (shift_dqp_send_state(d) == SHIFT_SEND_UNPROTECTED) {
			shift_dqp_retire_app(d, wc);
			fo_emit_after_srq(d, o, wc);
		} else {
			srq_burned(d, wc);
		}
		return; /* (else it failed over: the flush is SHIFT's) */
	}
	if (k == SHIFT_WC_PATH) {
		path_failure(s, d, wc, o);
		return;
	}
	if (shift_dqp_send_state(d) == SHIFT_SEND_DEFAULT && shift_dqp_recv_state(d) == SHIFT_RECV_DEFAULT) {
		unprotect(s, d, o, wc, wc->status == IBV_WC_WR_FLUSH_ERR ?
			  "the QP went to ERR with its device up, no path failure" :
			  "the application's error");
		return;
	}
	/* a direction is on the backup still: the connection ends for the
	 * application, its other WRs flush after this */
	shift_info("%s QP %u: the application's error (status %d, wr %#llx) on the default QP while "
		   "a direction is on the backup: the connection ends", d->dev, d->qpn,
		   (int)wc->status, (unsigned long long)wc->wr_id);
	fo_end_from(s, d, o, wc, "the application's error", 0, 0);
}

/* ---- an error of the application found by a failover's drain ------------ */

void fo_stash_add(struct shift_dqp *d, struct shift_cq *c, const struct ibv_wc *wc)
{
	struct shift_fo_stash *st = d->stash;
	enum shift_wc_class k = fo_wc_class(d, wc->status);

	st->app |= k == SHIFT_WC_APP;
	st->path |= k == SHIFT_WC_PATH;
	if (st->n == st->cap) {
		size_t cap = st->cap ? 2 * st->cap : 16;
		struct fo_stashed *e = realloc(st->e, cap * sizeof(*e));

		if (!e) {
			st->lost = true;
			return;
		}
		st->e = e;
		st->cap = cap;
	}
	st->e[st->n].wc = *wc;
	st->e[st->n].c = c;
	st->e[st->n].at = c->kept_head - c->kept_tail;
	st->n++;
}

/* The failover's trigger and the stashed completions, back where they
 * came (the trigger ahead of everything its drain kept). */
static void put_back(struct shift_dqp *d, struct out *o, const struct fo_start_ctx *sc,
		     struct shift_fo_stash *st)
{
	if (sc->err)
		shift_dqp_retire_app(d, sc->err); /* (an SRQ's receive is the application's) */
	if (sc->err && sc->direct && o->n < o->max)
		o->wc[o->n++] = *sc->err;
	else if (sc->err)
		fo_kept_insert(o->c, sc->at, sc->err);
	for (size_t i = 0; i < st->n; i++) {
		uint64_t before = sc->err && !sc->direct && st->e[i].c == o->c;

		shift_dqp_retire_app(d, &st->e[i].wc);

		for (size_t j = 0; j < i; j++)
			before += st->e[j].c == st->e[i].c;
		fo_kept_insert(st->e[i].c, st->e[i].at + before, &st->e[i].wc);
	}
	if (st->lost)
		shift_err("out of memory keeping completions: some completions lost");
}

/* The drain's SRQ receives that do not reach the application (srq_burned). */
static void srq_burned_all(struct shift_dqp *d, const struct shift_fo_stash *st)
{
	for (size_t i = 0; d->dsrq && i < st->n; i++)
		srq_burned(d, &st->e[i].wc);
}

static const struct ibv_wc *first_app(struct shift_dqp *d, const struct fo_start_ctx *sc,
				      const struct shift_fo_stash *st)
{
	if (sc->err && fo_wc_class(d, sc->err->status) == SHIFT_WC_APP)
		return sc->err;
	for (size_t i = 0; i < st->n; i++)
		if (fo_wc_class(d, st->e[i].wc.status) == SHIFT_WC_APP)
			return &st->e[i].wc;
	return sc->err;
}

/*
 * fo_start() stopped d's default QP and drained its CQs, d's errors in st:
 * does the failover go on (0)? Not if an error of the application is among
 * them, nor, for a trigger that may be no path failure (sc->unsure: a flush
 * first, a refused post), if none shows a path failure and the device
 * works. Then everything goes to the application as it came, the QP
 * unprotected (-2).
 */
int fo_judge_start(struct shift_ctx *s, struct shift_dqp *d, struct out *o,
		   const struct fo_start_ctx *sc, struct shift_fo_stash *st)
{
	enum shift_wc_class k = sc->err ? fo_wc_class(d, sc->err->status) : SHIFT_WC_OK;
	bool app = st->app || k == SHIFT_WC_APP;
	bool path = st->path || k == SHIFT_WC_PATH || d->dflt_path_err || d->port_was_down;

	if (!app && (path || !sc->unsure || !fo_port_active(s, d))) {
		srq_burned_all(d, st);
		return 0;
	}
	shift_info("%s QP %u: %s: no failover, the QP is no longer protected", d->dev, d->qpn,
		   app ? "an error of the application" : "its QP failed while its device works");
	if (sc->again) {
		/* a direction was on the backup: every WR flushes after the
		 * application's error */
		fo_fail_connection(d, o, "an error of the application", first_app(d, sc, st),
				   FO_TELL_PEER);
		srq_burned_all(d, st); /* (not handed out: no receive queue to flush) */
		return -2;
	}
	shift_dqp_lock(d);
	d->recv_hold = false;
	shift_dqp_set_send_state(d, SHIFT_SEND_UNPROTECTED, "the application's error");
	shift_dqp_set_recv_state(d, SHIFT_RECV_DEFAULT, "the application's error");
	shift_dqp_unlock(d);
	/* (as unprotect's: a peer that fails over towards my parked backup
	 * reads in my record that the connection ended, where my ABORT may
	 * never reach it: publish_app_end) */
	if (d->shadow)
		__atomic_store_n(&d->app_error_end, true, __ATOMIC_RELEASE);
	d->need_rearm = false; /* (its backup was not used) */
	if (!d->failovers)
		fo_remove(s, d);
	put_back(d, o, sc, st);
	/* the WRs the provider never had (refused, or posted while the start
	 * held posts): flushed, as plain flushes a post on a QP in ERR */
	if (sc->refused)
		fo_flush_held(d, o, NULL, d->sq_taken, d->rq_taken);
	else if (d->sq_head > sc->sq_stop || (!d->dsrq && d->rq_head > sc->rq_stop))
		fo_flush_held(d, o, NULL, sc->sq_stop, d->dsrq ? d->rq_head : sc->rq_stop);
	return -2;
}

int fo_start_unsure(struct shift_ctx *s, struct shift_dqp *d, struct out *o,
		    const struct ibv_wc *err)
{
	d->start_unsure = true;
	int rc = fo_start(s, d, o, err);

	d->start_unsure = false;
	return rc;
}

/* ---- the application ends the connection ----------------------------- */

/* The WRs from sq and rq on vanish without a completion (a reset). */
static void drop_held(struct shift_dqp *d)
{
	shift_dqp_retire_all_send(d);
	__atomic_store_n(&d->rq_tail, d->rq_head, __ATOMIC_RELAXED);
	shift_dqp_set_recv_state(d, SHIFT_RECV_DEFAULT, "the application reset the QP");
}

/*
 * Flushes SHIFT made up raise no event of their own: an application blocked
 * on its CQ's channel would not wake for them (plain's flushes raise one).
 * A WR posted on the stopped backup QP flushes there, and its CQ, armed
 * with the application's (shift/shadow/chan.c), raises the event, reported
 * as the application's CQ's; the completion itself is dropped (from_backup:
 * the application ended the QP). Best effort: a provider that refuses posts
 * in ERR gives no event.
 */
static void kick_channels(struct shift_dqp *d, bool sends, bool recvs)
{
	struct ibv_send_wr swr = { .wr_id = SHIFT_WRID_CTRL_SEND, .opcode = IBV_WR_RDMA_WRITE,
				   .send_flags = IBV_SEND_SIGNALED }, *sbad;
	struct ibv_recv_wr rwr = { .wr_id = SHIFT_WRID_CTRL_RECV }, *rbad;

	if (!d->bk)
		return;
	if (sends && d->scq && d->scq->bk_channel)
		(void)ibv_post_send(d->bk, &swr, &sbad);
	if (recvs && d->rcq && d->rcq->bk_channel)
		(void)ibv_post_recv(d->bk, &rwr, &rbad);
}

/*
 * The connection ends for the application (its ERR or RESET, or its error
 * while its sends are on the backup): the backup QP stops (its successes
 * kept for the application), the WRs SHIFT holds or had on the backup
 * flush (flush) or vanish, those on the default QP are the provider's, and
 * d is unprotected. Its CQs locked, under slow_lock.
 */
void fo_end(struct shift_ctx *s, struct shift_dqp *d, struct out *o, bool flush, const char *why)
{
	static const struct ibv_wc none;

	fo_end_from(s, d, o, flush ? &none : NULL, why, 0, 0);
}

/* (fo_end. err: NULL for a reset, else the QP goes to ERR and err, if it
 * has a status, is handed out after the backup's successes, which came
 * before it; the WRs before sq_min and rq_min are done with) */
void fo_end_from(struct shift_ctx *s, struct shift_dqp *d, struct out *o, const struct ibv_wc *err,
		 const char *why, uint64_t sq_min, uint64_t rq_min)
{
	bool flush = err != NULL;
	bool sends = shift_dqp_send_state(d) != SHIFT_SEND_DEFAULT;
	bool recvs = shift_dqp_recv_state(d) == SHIFT_RECV_FALLBACK;
	bool failed_over = d->need_rearm;

	d->app_ended = true;
	if (d->bk && d->need_rearm && (sends || recvs))
		fo_flush_backup(s, d, true);
	shift_dqp_lock(d);
	shift_dqp_sync_locked(d);
	uint64_t sq = sends ? d->sq_tail : d->sq_head;
	uint64_t rq = recvs ? SHIFT_LOAD(d->rq_tail) : d->rq_head;

	sq = sq < sq_min ? sq_min : sq;
	rq = rq < rq_min ? rq_min : rq;

	if (d->post_failed) {
		sq = sq < d->sq_taken ? sq : d->sq_taken;
		rq = rq < d->rq_taken ? rq : d->rq_taken;
	}
	d->recv_hold = false;
	d->notify_pending = false;
	d->post_failed = false;
	shift_dqp_set_send_state(d, SHIFT_SEND_UNPROTECTED, why);
	shift_dqp_unlock(d);
	if (flush) {
		/* the QP the application has is in ERR as plain's would be
		 * (SHIFT may have reset it for a failback) */
		struct ibv_qp_attr e = { .qp_state = IBV_QPS_ERR };

		shift_lower->modify_qp(d->qp, &e, IBV_QP_STATE);
		if (err->status != IBV_WC_SUCCESS) {
			shift_dqp_retire_app(d, err); /* (an SRQ's receive) */
			fo_emit_after_srq(d, o, err);
		}
		bool sflush = sq < d->sq_head, rflush = rq < d->rq_head;

		fo_flush_held(d, o, NULL, sq, rq);
		if (failed_over)
			kick_channels(d, sflush, rflush);
	} else {
		drop_held(d);
	}
	/* (one that failed over before may have SHIFT's WRs on its default
	 * QP still: the context stays in the slow poll, which drops them) */
	if (!d->failovers)
		fo_remove(s, d);
	shift_info("%s QP %u: %s: the QP is no longer protected", d->dev, d->qpn, why);
	/* a peer on its backup learns it from my record (its QP would
	 * fail on mine in ERR), not after its own backup's time-outs */
	if (failed_over && d->shadow && !d->peer_closed)
		fo_ep_publish(s, d);
}

/*
 * The application's error on its WR on the backup QP (its key refused by
 * the peer, its buffer too small...): in its place with the application's
 * wr_id, after the WRs before it (RC order: they completed), and the
 * connection ends as on the default QP: the rest flushes.
 */
void fo_backup_app_error(struct shift_ctx *s, struct shift_dqp *d, struct ibv_wc *wc,
			 struct out *o)
{
	uint64_t idx = SHIFT_WRID_INDEX(wc->wr_id);
	bool recv = (wc->wr_id & SHIFT_WRID_RECV) != 0;

	shift_info("%s QP %u: the application's error (status %d) on the backup QP: the "
		   "connection ends", d->dev, d->qpn, (int)wc->status);
	d->app_ended = true; /* (no failback step from here) */
	fo_app_translate(d, wc);
	fo_end_from(s, d, o, wc, "the application's error", recv ? 0 : idx + 1, recv ? idx + 1 : 0);
}

void shift_failover_app_ended(struct shift_dqp *d, bool flush)
{
	struct shift_ctx *s = shift_ctx_of(d->qp->context);

	if (!s || !d->scq || !d->rcq) {
		/* (never failed over, nothing held) */
		shift_dqp_lock(d);
		shift_dqp_set_send_state(d, SHIFT_SEND_UNPROTECTED, "the application ended the connection");
		shift_dqp_unlock(d);
		return;
	}
	pthread_mutex_lock(&s->slow_lock);
	fo_lock_cqs(d);
	if (shift_dqp_send_state(d) != SHIFT_SEND_UNPROTECTED) {
		struct out o = { .wc = NULL, .n = 0, .max = 0, .c = d->scq };

		if (shift_dqp_send_state(d) != SHIFT_SEND_DEFAULT || shift_dqp_recv_state(d) != SHIFT_RECV_DEFAULT ||
		    d->post_failed)
			shift_ctx_set_slow(s, true); /* (its completions are kept) */
		fo_end(s, d, &o, flush, "the application ended the connection");
	}
	fo_unlock_cqs(d);
	pthread_mutex_unlock(&s->slow_lock);
}

/* What plain libibverbs would report: the application's state while SHIFT
 * runs the default QP (failed over), its own retry_cnt. */
void shift_failover_query_qp(struct shift_dqp *d, struct ibv_qp_attr *attr, int mask)
{
	enum shift_send_state ss = __atomic_load_n(&d->send_state, __ATOMIC_ACQUIRE);
	enum shift_recv_state rs = __atomic_load_n(&d->recv_state, __ATOMIC_ACQUIRE);
	struct shift_rnic *r = d->qp->context ? shift_rnic_of(d->qp->context) : NULL;

	if ((mask & IBV_QP_RETRY_CNT) && d->retry_cnt_changed)
		attr->retry_cnt = d->app_retry_cnt;
	/* (stopping: SHIFT's own ERR, before the posts are held) */
	if (ss == SHIFT_SEND_UNPROTECTED ||
	    (ss == SHIFT_SEND_DEFAULT && rs == SHIFT_RECV_DEFAULT &&
	     !__atomic_load_n(&d->stopping, __ATOMIC_ACQUIRE)) ||
	    !d->shadow || !r)
		return;
	pthread_mutex_lock(&r->lock);
	enum ibv_qp_state st = d->shadow->app_state;
	pthread_mutex_unlock(&r->lock);
	attr->qp_state = st;
	attr->cur_qp_state = st;
}

bool shift_failover_hides_event(struct shift_dqp *d, enum ibv_event_type t)
{
	struct shift_ctx *s = shift_ctx_of(d->qp->context);
	enum shift_send_state ss = __atomic_load_n(&d->send_state, __ATOMIC_ACQUIRE);

	if (!s || ss == SHIFT_SEND_UNPROTECTED || !d->shadow ||
	    __atomic_load_n(&d->shadow->state, __ATOMIC_ACQUIRE) != SHIFT_SHADOW_READY)
		return false;
	/* (failed over: the default QP is SHIFT's to run) */
	if (ss != SHIFT_SEND_DEFAULT || __atomic_load_n(&d->recv_state, __ATOMIC_ACQUIRE))
		return true;
	/* a bad request of the peer's application hit this responder (IBA
	 * class C): the application's, as its flushes are */
	if (t == IBV_EVENT_QP_REQ_ERR || t == IBV_EVENT_QP_ACCESS_ERR)
		return false;
	/* a catastrophic error of the QP: SHIFT fails it over only if its
	 * device went away (as for its flushes, fo_on_error) */
	return d->port_was_down || !fo_port_active(s, d);
}
