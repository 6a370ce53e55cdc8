/*
 * Failover: moving an application QP's traffic to its backup QP when the
 * default path fails, invisibly to the application (SHIFT paper §4.3.2).
 *
 * Detection: an error completion of a protected QP while polling. Before
 * anything moves, the default CQ is drained: completions that succeeded are
 * kept for the application, in order (appendix B.2), and the QP's error and
 * flush completions are dropped.
 *
 * The boundary: if an atomic is among the outstanding send WRs, it may or
 * may not have executed at the peer and retrying could apply it twice, so
 * the error goes to the application and nothing is retransmitted.
 *
 * The two-way handshake on the backup QPs: each side reposts its
 * outstanding receives on its backup QP, then sends one WRITE_WITH_IMM whose
 * immediate is its receive counter (receives consumed so far). That message
 * lands in the control receive SHIFT keeps at the head of the peer's backup
 * receive queue, so it never consumes or reorders an application receive.
 * A side that gets the peer's message first does the same (reposts, answers
 * with its own counter); a side that has both sent and received one
 * retransmits its outstanding sends, skipping those the peer's counter says
 * were executed already (the request arrived, the ACK was lost): those
 * complete to the application without being sent again.
 *
 * Completions: once a context has a failed-over QP its polls take the slow
 * path here: kept completions first, then the default CQ, then the backup
 * CQ, whose completions are translated (the application's wr_id and QP
 * number). SHIFT's own completions never reach the application.
 *
 * Not yet: failback to the recovered default NIC (probe, WaitSignaled,
 * WaitDrained), which is why a failed-over QP stays on its backup.
 */
#include "shift/failover.h"
#include "shift/exchange.h"
#include "shift/shadow.h"
#include "shift/shift.h"
#include "kv/kv.h"

#include <endian.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define TMP_WC 16
#define SHIFT_BG_GRACE_MS 20

/* The handshake message's immediate: the sender's receive counter (31 bits,
 * compared modulo 2^31), or ABORT: the sender cannot fail over (an atomic
 * was in flight), so the connection fails for the application at both ends. */
#define CTRL_ABORT 0x80000000u
#define CTRL_COUNT(x) ((x) & 0x7fffffffu)

/* ---- kept completions ------------------------------------------------- */

static int kept_push(struct shift_cq *c, const struct ibv_wc *wc)
{
	if (c->kept_head - c->kept_tail == c->kept_cap) {
		unsigned cap = c->kept_cap ? c->kept_cap * 2 : 256;
		struct ibv_wc *n = malloc(sizeof(*n) * cap);

		if (!n)
			return -1;
		for (uint64_t i = c->kept_tail, j = 0; i < c->kept_head; i++, j++)
			n[j] = c->kept[i % c->kept_cap];
		c->kept_head -= c->kept_tail;
		c->kept_tail = 0;
		free(c->kept);
		c->kept = n;
		c->kept_cap = cap;
	}
	c->kept[c->kept_head++ % c->kept_cap] = *wc;
	return 0;
}

struct out {
	struct ibv_wc *wc;
	int n, max;
	struct shift_cq *c;
	/* completions already taken from c's default CQ and not filtered yet
	 * (the rest of the batch being filtered): older than anything still
	 * in the CQ, so a drain of c must filter them first */
	struct ibv_wc *rest;
	size_t nrest;
	struct out *up; /* the caller's, when filtering inside a drain */
};

/* To the application now if its array has room, else kept for later. */
static void emit(struct out *o, const struct ibv_wc *wc)
{
	/* older completions wait in kept: keep the order */
	if (o->n < o->max && o->c->kept_head == o->c->kept_tail)
		o->wc[o->n++] = *wc;
	else if (kept_push(o->c, wc))
		shift_err("out of memory keeping a completion: one completion lost");
}

/* ---- the failed-over QPs of a context ------------------------------------ */

static struct shift_dqp *dqp_of_bk(struct shift_ctx *s, uint32_t bk_qpn)
{
	for (int i = 0; i < s->nfo; i++)
		if (s->fo[i]->bk && s->fo[i]->bk->qp_num == bk_qpn)
			return s->fo[i];
	return NULL;
}

/* ---- key translation -------------------------------------------------- */

static int remote_key(struct shift_dqp *d, uint32_t app_rkey, uint32_t *bk)
{
	struct shift_rnic *r = shift_rnic_of(d->qp->context);
	char key[SHIFT_EXCHANGE_KEY_MAX];
	void *v;
	size_t len;

	for (unsigned i = 0; i < d->nrkeys; i++) {
		if (d->rkeys[i].app == app_rkey) {
			*bk = d->rkeys[i].bk;
			return 0;
		}
	}
	if (!r || !r->kv ||
	    shift_exchange_mr_key(&d->shadow->peer_key.gid, app_rkey, key, sizeof(key)) < 0 ||
	    shift_kv_get(r->kv, key, &v, &len))
		return -1;
	int rc = shift_exchange_mr_decode(v, len, bk);
	free(v);
	if (rc)
		return -1;
	d->rkeys[d->nrkeys % 16].app = app_rkey;
	d->rkeys[d->nrkeys % 16].bk = *bk;
	d->nrkeys++;
	return 0;
}

static int local_keys(struct shift_dqp *d, struct ibv_sge *sge, unsigned n)
{
	struct shift_rnic *r = shift_rnic_of(d->qp->context);

	for (unsigned i = 0; i < n; i++)
		if (!r || shift_shadow_bk_lkey(r, sge[i].lkey, &sge[i].lkey))
			return -1;
	return 0;
}

/* ---- posting on the backup QP ------------------------------------------ */

static int post_bk_send(struct shift_dqp *d, uint64_t idx)
{
	struct shift_swqe *e = shift_dqp_swqe(d, idx);
	struct ibv_sge sge[e->num_sge ? e->num_sge : 1];
	struct ibv_send_wr wr, *bad;

	memset(&wr, 0, sizeof(wr));
	wr.wr_id = SHIFT_WRID_DATA | idx;
	wr.opcode = (enum ibv_wr_opcode)e->opcode;
	wr.send_flags = e->send_flags;
	wr.imm_data = e->imm;
	if (e->send_flags & IBV_SEND_INLINE) {
		sge[0].addr = (uintptr_t)&e->sge[d->max_send_sge];
		sge[0].length = e->inline_len;
		sge[0].lkey = 0;
		wr.num_sge = e->inline_len ? 1 : 0;
	} else {
		memcpy(sge, e->sge, sizeof(struct ibv_sge) * e->num_sge);
		wr.num_sge = e->num_sge;
		if (local_keys(d, sge, e->num_sge)) {
			shift_debug("%s QP %u: no backup lkey for lkey %u", d->dev, d->qpn, sge[0].lkey);
			return -1;
		}
	}
	wr.sg_list = sge;
	if (e->opcode == IBV_WR_RDMA_WRITE || e->opcode == IBV_WR_RDMA_WRITE_WITH_IMM ||
	    e->opcode == IBV_WR_RDMA_READ) {
		wr.wr.rdma.remote_addr = e->remote_addr;
		uint64_t bytes = e->inline_len;

		for (unsigned k = 0; k < e->num_sge && !(e->send_flags & IBV_SEND_INLINE); k++)
			bytes += e->sge[k].length;
		/* a zero-length write touches no remote memory: its key is not used */
		if (!bytes)
			wr.wr.rdma.rkey = e->rkey;
		else if (remote_key(d, e->rkey, &wr.wr.rdma.rkey)) {
			shift_debug("%s QP %u: no backup rkey for the peer's rkey %u (opcode %u, %lu bytes, flags %x)", d->dev, d->qpn, e->rkey, e->opcode, (unsigned long)bytes, e->send_flags);
			return -1;
		}
	}
	if (shift_wr_is_atomic(e->opcode)) {
		/* only posted here once failed over: never a retransmission */
		wr.wr.atomic.remote_addr = e->remote_addr;
		wr.wr.atomic.compare_add = e->compare_add;
		wr.wr.atomic.swap = e->swap;
		if (remote_key(d, e->rkey, &wr.wr.atomic.rkey)) {
			shift_debug("%s QP %u: no backup rkey for the peer's rkey %u (atomic)", d->dev, d->qpn,
				    e->rkey);
			return -1;
		}
	}
	int rc = ibv_post_send(d->bk, &wr, &bad);
	if (rc) {
		shift_debug("%s QP %u: backup post_send: %s", d->dev, d->qpn, strerror(rc));
		return -1;
	}
	d->retransmitted++;
	return 0;
}

static int post_bk_recv(struct shift_dqp *d, uint64_t idx)
{
	struct shift_rwqe *e = shift_dqp_rwqe(d, idx);
	struct ibv_sge sge[e->num_sge ? e->num_sge : 1];
	struct ibv_recv_wr wr = { .wr_id = SHIFT_WRID_DATA | SHIFT_WRID_RECV | idx,
				  .sg_list = sge, .num_sge = (int)e->num_sge }, *bad;

	memcpy(sge, e->sge, sizeof(struct ibv_sge) * e->num_sge);
	if (local_keys(d, sge, e->num_sge))
		return -1;
	return ibv_post_recv(d->bk, &wr, &bad) ? -1 : 0;
}

/* ---- failing over --------------------------------------------------------- */

static void give_up(struct shift_dqp *d, const char *why)
{
	if (d->send_state != SHIFT_SEND_UNPROTECTED)
		shift_warn("%s QP %u: cannot fail over (%s): the error goes to the application",
			   d->dev, d->qpn, why);
	d->send_state = SHIFT_SEND_UNPROTECTED;
}

static void from_default(struct shift_ctx *s, struct ibv_wc *wc, struct out *o);

/* Filter n completions taken from o->c's default CQ, in order. */
static void from_default_batch(struct shift_ctx *s, struct ibv_wc *wc, size_t n, struct out *o)
{
	o->rest = wc;
	o->nrest = n;
	while (o->nrest) {
		o->nrest--;
		from_default(s, o->rest++, o);
	}
	o->rest = NULL;
}

/* Drain one default CQ after d's QP went to ERR. Everything in it goes
 * through the usual filter into the kept completions, in order: d's
 * successes are retired and kept, its errors dropped; another QP's error
 * may start that QP's own failover. A caller filtering a batch taken from
 * this CQ (the error that started this drain was in it) has not filtered
 * the rest of it: those come first, before the receive counter is read. */
static void drain_default(struct shift_ctx *s, struct shift_cq *c, struct out *up)
{
	struct ibv_wc *all = NULL, tmp[TMP_WC];
	size_t n_all = 0, cap = 0;
	int n;

	for (struct out *p = up; p; p = p->up) {
		if (p->c != c || !p->nrest)
			continue;
		all = malloc(p->nrest * sizeof(*all));
		if (!all)
			break;
		memcpy(all, p->rest, p->nrest * sizeof(*all));
		n_all = cap = p->nrest;
		p->nrest = 0;
		break; /* only the innermost batch of c can have a rest */
	}
	while ((n = s->poll_cq(c->app, TMP_WC, tmp)) > 0) {
		if (n_all + (size_t)n > cap) {
			size_t ncap = cap ? cap * 2 : 64;

			while (ncap < n_all + (size_t)n)
				ncap *= 2;
			struct ibv_wc *na = realloc(all, ncap * sizeof(*na));

			if (!na)
				break;
			all = na;
			cap = ncap;
		}
		memcpy(all + n_all, tmp, sizeof(*tmp) * (size_t)n);
		n_all += (size_t)n;
	}
	struct out o = { .wc = NULL, .n = 0, .max = 0, .c = c, .up = up };
	from_default_batch(s, all, n_all, &o);
	free(all);
}

static int send_ctrl(struct shift_dqp *d, uint32_t imm)
{
	struct ibv_send_wr wr, *bad;

	memset(&wr, 0, sizeof(wr));
	wr.wr_id = SHIFT_WRID_CTRL_SEND;
	wr.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
	wr.send_flags = IBV_SEND_SIGNALED;
	wr.imm_data = htobe32(imm);
	return ibv_post_send(d->bk, &wr, &bad);
}

/*
 * The connection cannot be saved (an atomic in flight at either end): the
 * application gets errors, as it would without SHIFT. The default QP goes
 * to ERR so its outstanding WRs flush to the application now, and WRs SHIFT
 * was holding for the backup complete with a flush error too.
 */
static void fail_connection(struct shift_ctx *s, struct shift_dqp *d, struct out *o,
			    bool tell_peer, const struct ibv_wc *err)
{
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_ERR };
	bool held = d->send_state == SHIFT_SEND_FALLBACK;

	if (tell_peer && d->shadow &&
	    __atomic_load_n(&d->shadow->state, __ATOMIC_ACQUIRE) == SHIFT_SHADOW_READY) {
		if (!d->bk)
			d->bk = d->shadow->bk;
		d->ctrl_sent = send_ctrl(d, CTRL_ABORT) == 0;
	}
	d->send_state = SHIFT_SEND_UNPROTECTED;
	if (!held) {
		shift_lower->modify_qp(d->qp, &a, IBV_QP_STATE);
		return;
	}
	(void)s;
	for (uint64_t i = d->sq_tail; i < d->sq_head; i++) {
		struct ibv_wc wc = { .wr_id = shift_dqp_swqe(d, i)->wr_id,
				     .status = IBV_WC_WR_FLUSH_ERR, .qp_num = d->qpn };
		/* the error that started it, in its place with its status */
		if (err && i == d->sq_tail && err->wr_id == wc.wr_id) {
			wc = *err;
			err = NULL;
		}
		emit(o, &wc);
	}
	d->sq_tail = d->sq_head;
	d->sig_tail = d->sig_head;
	for (uint64_t i = d->rq_tail; i < d->rq_head; i++) {
		struct ibv_wc wc = { .wr_id = shift_dqp_rwqe(d, i)->wr_id,
				     .status = IBV_WC_WR_FLUSH_ERR, .qp_num = d->qpn,
				     .opcode = IBV_WC_RECV };
		if (err && i == d->rq_tail && err->wr_id == wc.wr_id) {
			wc = *err;
			err = NULL;
		}
		emit(o, &wc);
	}
	d->rq_tail = d->rq_head;
	d->recv_state = SHIFT_RECV_DEFAULT;
}

/*
 * My side of the handshake: stop the default QP, account for everything it
 * completed, repost my outstanding receives on the backup, and tell the peer
 * my receive counter. Called with d's CQs locked.
 */
static int start(struct shift_ctx *s, struct shift_dqp *d, struct out *o,
		 const struct ibv_wc *err)
{
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_ERR };

	if (d->send_state != SHIFT_SEND_DEFAULT)
		return 0;
	if (!d->shadow || !d->scq || !d->rcq ||
	    __atomic_load_n(&d->shadow->state, __ATOMIC_ACQUIRE) != SHIFT_SHADOW_READY) {
		give_up(d, "its backup QP is not ready");
		return -1;
	}
	if (s->nfo == SHIFT_MAX_FO) {
		give_up(d, "too many failed-over QPs in this context");
		return -1;
	}
	d->bk = d->shadow->bk;
	shift_lower->modify_qp(d->qp, &a, IBV_QP_STATE);
	s->fo[s->nfo++] = d;
	__atomic_store_n(&s->slow, true, __ATOMIC_RELEASE);
	shift_dqp_lock(d);
	d->send_state = SHIFT_SEND_FALLBACK;
	d->recv_state = SHIFT_RECV_FALLBACK;
	shift_dqp_unlock(d);
	drain_default(s, d->scq, o);
	if (d->rcq != d->scq)
		drain_default(s, d->rcq, o);
	/* The boundary, judged only now: an atomic whose successful completion
	 * was still in the default CQ is done, not in flight. The QP's error
	 * and flush completions were dropped by the drain: the application
	 * gets its outstanding WRs flushed (fail_connection, held). */
	for (uint64_t i = d->sq_tail; i < d->sq_head; i++) {
		if (shift_wr_is_atomic(shift_dqp_swqe(d, i)->opcode)) {
			d->atomic_boundary_hit = true;
			shift_warn("%s QP %u: cannot fail over (an atomic was in flight: retrying it "
				   "could apply it twice): the error goes to the application",
				   d->dev, d->qpn);
			fail_connection(s, d, o, true, err);
			return -2;
		}
	}
	shift_dqp_lock(d);
	d->handshake_done = false;
	d->failovers++;
	for (uint64_t i = d->rq_tail; i < d->rq_head; i++) {
		if (post_bk_recv(d, i)) {
			shift_dqp_unlock(d);
			give_up(d, "cannot repost a receive on the backup QP");
			return -1;
		}
	}
	shift_dqp_unlock(d);
	if (send_ctrl(d, CTRL_COUNT((uint32_t)d->rq_tail))) {
		give_up(d, "cannot send the handshake message");
		return -1;
	}
	d->ctrl_sent = true;
	shift_info("%s QP %u: failing over to backup QP %u (receive counter %u)", d->dev, d->qpn,
		   d->bk->qp_num, (uint32_t)d->rq_tail);
	shift_debug("%s QP %u: sq %llu..%llu, rq %llu..%llu, recv consumers posted %llu", d->dev, d->qpn,
		    (unsigned long long)d->sq_tail, (unsigned long long)d->sq_head,
		    (unsigned long long)d->rq_tail, (unsigned long long)d->rq_head,
		    (unsigned long long)d->recv_consumers_posted);
	return 0;
}

/* Both messages exchanged: retransmit what the peer has not executed. */
static void retransmit(struct shift_dqp *d, struct out *o)
{
	uint64_t outstanding_consumers = 0, skip, i;

	for (i = d->sq_tail; i < d->sq_head; i++)
		outstanding_consumers += shift_wr_consumes_recv(shift_dqp_swqe(d, i)->opcode);
	uint32_t done = CTRL_COUNT((uint32_t)(d->recv_consumers_posted - outstanding_consumers));
	skip = CTRL_COUNT(d->peer_recv_count - done);
	shift_debug("%s QP %u: peer counter %u, mine: %u done, %llu outstanding consumers", d->dev, d->qpn,
		    d->peer_recv_count, done, (unsigned long long)outstanding_consumers);
	if (skip > outstanding_consumers) {
		shift_warn("%s QP %u: the peer's receive counter (%u) is ahead of what was sent; "
			   "retransmitting everything", d->dev, d->qpn, d->peer_recv_count);
		skip = 0;
	}
	/* executed at the peer, ACK lost: complete them, do not send again */
	for (i = d->sq_tail; skip && i < d->sq_head; i++) {
		struct shift_swqe *e = shift_dqp_swqe(d, i);

		if (shift_wr_consumes_recv(e->opcode))
			skip--;
		if ((e->send_flags & IBV_SEND_SIGNALED) || d->sq_sig_all) {
			struct ibv_wc wc = {
				.wr_id = e->wr_id, .status = IBV_WC_SUCCESS,
				.opcode = e->opcode == IBV_WR_RDMA_READ ? IBV_WC_RDMA_READ :
					  e->opcode == IBV_WR_SEND || e->opcode == IBV_WR_SEND_WITH_IMM ?
					  IBV_WC_SEND : IBV_WC_RDMA_WRITE,
				.qp_num = d->qpn,
			};
			d->sq_tail = i + 1;
			d->sig_tail++;
			emit(o, &wc);
		}
	}
	shift_dqp_lock(d);
	d->handshake_done = true;
	for (; i < d->sq_head; i++) {
		if (post_bk_send(d, i)) {
			shift_dqp_unlock(d);
			give_up(d, "cannot post a WR on the backup QP");
			return;
		}
	}
	shift_dqp_unlock(d);
	shift_info("%s QP %u: on backup QP %u, %lu WRs retransmitted", d->dev, d->qpn, d->bk->qp_num,
		   d->retransmitted);
}

/* The peer's handshake message arrived for d. */
static void on_ctrl(struct shift_ctx *s, struct shift_dqp *d, struct out *o)
{
	d->ctrl_pending = false;
	if (d->peer_recv_count & CTRL_ABORT) {
		if (d->send_state != SHIFT_SEND_UNPROTECTED) {
			shift_warn("%s QP %u: the peer cannot fail over (an atomic was in flight): "
				   "the connection fails for the application", d->dev, d->qpn);
			fail_connection(s, d, o, false, NULL);
		}
		return;
	}
	if (d->send_state == SHIFT_SEND_UNPROTECTED) {
		/* the peer waits for my answer: tell it the connection is over
		 * here (the application closed it, or it cannot be saved) */
		if (!d->ctrl_sent && d->shadow &&
		    __atomic_load_n(&d->shadow->state, __ATOMIC_ACQUIRE) == SHIFT_SHADOW_READY) {
			if (!d->bk)
				d->bk = d->shadow->bk;
			d->ctrl_sent = send_ctrl(d, CTRL_ABORT) == 0;
		}
		return;
	}
	if (d->send_state == SHIFT_SEND_DEFAULT && start(s, d, o, NULL))
		return;
	if (d->send_state != SHIFT_SEND_UNPROTECTED && !d->handshake_done)
		retransmit(d, o);
}

/* ---- polling ---------------------------------------------------------------- */

/* A completion from a default CQ, in the slow path. */
static void from_default(struct shift_ctx *s, struct ibv_wc *wc, struct out *o)
{
	struct shift_dqp *d = shift_dqp_by_qpn(s, wc->qp_num);

	if (!d || d->send_state == SHIFT_SEND_UNPROTECTED) {
		emit(o, wc);
		return;
	}
	if (wc->status == IBV_WC_SUCCESS) {
		shift_dqp_retire(d, wc);
		emit(o, wc);
		return;
	}
	if (d->send_state != SHIFT_SEND_DEFAULT)
		return; /* a flush of a QP already on its backup */
	int rc = start(s, d, o, wc);

	if (rc == 0) {
		if (d->ctrl_pending)
			on_ctrl(s, d, o);
		return; /* the error itself is SHIFT's, not the application's */
	}
	if (rc == -2)
		return; /* the connection failed: wc was passed on with the flushes */
	shift_debug("%s QP %u: error %d passed to the application", d->dev, d->qpn, (int)wc->status);
	emit(o, wc);
}

/* A completion from a backup CQ: SHIFT's own, or one to translate. */
static void from_backup(struct shift_ctx *s, struct ibv_wc *wc, struct out *o, bool app)
{
	struct shift_dqp *d = dqp_of_bk(s, wc->qp_num);

	if (wc->wr_id == SHIFT_WRID_CTRL_RECV) {
		if (!d) {
			/* the peer failed over first: find my QP by its backup */
			for (int i = 0; i < SHIFT_DQP_BUCKETS && !d; i++)
				for (struct shift_dqp *x = s->dqp[i]; x; x = x->next_in_bucket)
					if (x->shadow && x->shadow->bk && x->shadow->bk->qp_num == wc->qp_num)
						d = x;
		}
		shift_debug("control message on backup QP %u: status %d, QP %u, app %d", wc->qp_num,
			    (int)wc->status, d ? d->qpn : 0, app);
		if (!d || wc->status != IBV_WC_SUCCESS)
			return;
		d->peer_recv_count = be32toh(wc->imm_data);
		d->ctrl_pending = true;
		__atomic_store_n(&s->slow, true, __ATOMIC_RELEASE);
		if (app || d->send_state == SHIFT_SEND_UNPROTECTED)
			on_ctrl(s, d, o); /* the latter only answers ABORT */
		return;
	}
	if (wc->wr_id == SHIFT_WRID_CTRL_SEND || !d) {
		if (wc->status != IBV_WC_SUCCESS)
			shift_debug("backup QP %u: SHIFT's WR %llx failed: %d", wc->qp_num,
				    (unsigned long long)wc->wr_id, (int)wc->status);
		return;
	}
	if (!(wc->wr_id & SHIFT_WRID_DATA))
		return;
	uint64_t idx = SHIFT_WRID_INDEX(wc->wr_id);
	if (wc->wr_id & SHIFT_WRID_RECV) {
		wc->wr_id = shift_dqp_rwqe(d, idx)->wr_id;
	} else {
		wc->wr_id = shift_dqp_swqe(d, idx)->wr_id;
	}
	wc->qp_num = d->qpn;
	if (wc->status == IBV_WC_SUCCESS)
		shift_dqp_retire(d, wc);
	else if (wc->status != IBV_WC_WR_FLUSH_ERR || d->send_state != SHIFT_SEND_UNPROTECTED) {
		shift_debug("%s QP %u: backup completion error %d", d->dev, d->qpn, wc->status);
		give_up(d, "the backup path failed too");
	}
	emit(o, wc);
}

static void poll_backup(struct shift_ctx *s, struct shift_cq *c, struct out *o, bool app)
{
	struct ibv_wc tmp[TMP_WC];
	int n;

	if (!c->bk)
		return;
	while ((!app || o->n < o->max) && (n = ibv_poll_cq(c->bk, TMP_WC, tmp)) > 0)
		for (int i = 0; i < n; i++)
			from_backup(s, &tmp[i], o, app);
}

int shift_poll_slow(struct shift_ctx *s, struct ibv_cq *cq, int num_entries,
		    struct ibv_wc *wc, int done, int have)
{
	struct shift_cq *c = s->rnic ? shift_shadow_cq_of(s->rnic, cq) : NULL;
	struct out o = { .wc = wc, .n = done, .max = num_entries, .c = c };
	struct ibv_wc tmp[TMP_WC];
	int n;

	if (!c) {
		/* not shadowed: nothing can be failed over on it */
		if (have)
			return have;
		return s->poll_cq(cq, num_entries, wc);
	}
	pthread_mutex_lock(&c->dp_lock);
	/* completions the fast path already took from the provider */
	if (have > done) {
		int m = have - done;
		struct ibv_wc *src = m <= TMP_WC ? tmp : malloc(sizeof(*wc) * (size_t)m);

		if (!src) {
			pthread_mutex_unlock(&c->dp_lock);
			return have; /* cannot look: the application gets them as they are */
		}
		memcpy(src, wc + done, sizeof(*wc) * (size_t)m);
		from_default_batch(s, src, (size_t)m, &o);
		if (src != tmp)
			free(src);
	}
	while (o.n < o.max && c->kept_tail != c->kept_head)
		o.wc[o.n++] = c->kept[c->kept_tail++ % c->kept_cap];
	/* peers' handshake messages noticed by the background thread */
	for (int i = 0; i < SHIFT_DQP_BUCKETS; i++)
		for (struct shift_dqp *d = s->dqp[i]; d; d = d->next_in_bucket)
			if (d->ctrl_pending && (d->scq == c || d->rcq == c))
				on_ctrl(s, d, &o);
	while (o.n < o.max && c->kept_tail != c->kept_head)
		o.wc[o.n++] = c->kept[c->kept_tail++ % c->kept_cap];
	while (o.n < o.max && (n = s->poll_cq(cq, TMP_WC < o.max - o.n ? TMP_WC : o.max - o.n, tmp)) > 0)
		from_default_batch(s, tmp, (size_t)n, &o);
	poll_backup(s, c, &o, true);
	pthread_mutex_unlock(&c->dp_lock);
	return o.n;
}

void shift_failover_background(struct shift_ctx *s)
{
	struct shift_rnic *r = s->rnic;

	if (!r)
		return;
	/* a peer's handshake message lands in a backup CQ nobody else polls
	 * while this side is in the Default state */
	pthread_mutex_lock(&r->lock);
	struct shift_cq *head = r->cqs;
	pthread_mutex_unlock(&r->lock);
	for (struct shift_cq *c = head; c; c = c->next) {
		if (!c->bk || c->dead || pthread_mutex_trylock(&c->dp_lock))
			continue;
		struct out o = { .wc = NULL, .n = 0, .max = 0, .c = c };
		poll_backup(s, c, &o, false);
		pthread_mutex_unlock(&c->dp_lock);
	}

	/*
	 * A passive application (a perftest server waiting on its socket)
	 * may never poll: answer the peer here. The context went to the slow
	 * path when the message was seen; once a grace period has passed, no
	 * poll of the application can still be inside the fast path (it is a
	 * few hundred instructions), so the default CQ is ours under dp_lock.
	 */
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	uint64_t now = (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
	for (int i = 0; i < SHIFT_DQP_BUCKETS; i++) {
		for (struct shift_dqp *d = __atomic_load_n(&s->dqp[i], __ATOMIC_ACQUIRE); d;
		     d = d->next_in_bucket) {
			if (!d->ctrl_pending || !d->scq)
				continue;
			if (!d->ctrl_seen_ms)
				d->ctrl_seen_ms = now;
			if (!shift_shadow_sync && now - d->ctrl_seen_ms < SHIFT_BG_GRACE_MS)
				continue;
			struct shift_cq *c1 = d->scq, *c2 = d->rcq && d->rcq != d->scq ? d->rcq : NULL;
			if (c2 && c2 < c1) {
				struct shift_cq *t = c1;
				c1 = c2;
				c2 = t;
			}
			pthread_mutex_lock(&c1->dp_lock);
			if (c2)
				pthread_mutex_lock(&c2->dp_lock);
			if (d->ctrl_pending) {
				struct out o = { .wc = NULL, .n = 0, .max = 0, .c = d->rcq ? d->rcq : d->scq };
				on_ctrl(s, d, &o);
			}
			if (c2)
				pthread_mutex_unlock(&c2->dp_lock);
			pthread_mutex_unlock(&c1->dp_lock);
		}
	}
}

/* ---- posting while failed over --------------------------------------------- */

int shift_post_send_fallback(struct shift_dqp *d, struct ibv_send_wr *wr,
			     struct ibv_send_wr **bad_wr)
{
	uint64_t head = d->sq_head;

	if (shift_dqp_record_send(d, wr)) {
		*bad_wr = wr;
		return ENOMEM;
	}
	if (!d->handshake_done)
		return 0; /* held: retransmit() posts them after the handshake */
	for (uint64_t i = head; i < d->sq_head; i++) {
		if (post_bk_send(d, i)) {
			/* report the first WR that did not go out */
			struct ibv_send_wr *w = wr;

			for (uint64_t k = head; k < i; k++)
				w = w->next;
			shift_dqp_unrecord_send(d, wr, w, head);
			*bad_wr = w;
			return EIO;
		}
	}
	return 0;
}

int shift_post_recv_fallback(struct shift_dqp *d, struct ibv_recv_wr *wr,
			     struct ibv_recv_wr **bad_wr)
{
	uint64_t head = d->rq_head;

	if (shift_dqp_record_recv(d, wr)) {
		*bad_wr = wr;
		return ENOMEM;
	}
	for (uint64_t i = head; i < d->rq_head; i++) {
		if (post_bk_recv(d, i)) {
			struct ibv_recv_wr *w = wr;

			for (uint64_t k = head; k < i; k++)
				w = w->next;
			shift_dqp_unrecord_recv(d, wr, w, head);
			*bad_wr = w;
			return EIO;
		}
	}
	return 0;
}
