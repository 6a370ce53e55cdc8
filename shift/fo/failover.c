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
#include "shift/fo/failover.h"
#include "shift/shadow/exchange.h"
#include "shift/shadow/shadow.h"
#include "shift/base/lower.h"
#include "shift/dp/ctx.h"
#include "shift/base/clock.h"
#include "shift/base/config.h"
#include "shift/dp/state.h"
#include "kv/kv.h"
#include "providers/quirks.h"

#include <endian.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define TMP_WC 16
/* after a backup failure the peer did not follow up: my own new failover,
 * after shift_config.bk_restart_ms, at most this many times in a row (how
 * long a failover after the first waits for the peer's part, its record in
 * the KV store or its handshake message, is shift_config.episode_wait_ms) */
#define SHIFT_BK_RESTARTS 3

/* The handshake message's immediate: the sender's receive counter (31 bits,
 * compared modulo 2^31), or ABORT: the sender cannot fail over (an atomic
 * was in flight), so the connection fails for the application at both ends. */
#define CTRL_ABORT 0x80000000u
/* ... and NOSEND: the sender's application never brought its QP to RTS (a
 * receive-only peer): it will never send, nor notify a failback */
#define CTRL_NOSEND 0x40000000u
#define CTRL_COUNT(x) ((x) & 0x3fffffffu)

/* ---- time ------------------------------------------------------------- */

static uint64_t mono_us(void)
{
	return shift_clock_us();
}

/* The failback clock (ms of shift_clock; a driver's logical clock counts
 * background passes instead, base/clock.h). */
static uint64_t fb_now(void)
{
	return shift_clock_ms();
}

/* Wait before the next probe of a failed default path: the probe period,
 * doubled per failed probe up to 8 periods, and doubled again per switch
 * back that failed right away (its notification), up to 16 more: a path
 * that answers probes but fails real traffic is not worth a new failover
 * every period. */
static uint64_t probe_wait(const struct shift_dqp *d)
{
	uint64_t base = shift_config.probe_ms ? shift_config.probe_ms : 1;
	unsigned sh = d->probe_fails < 3 ? d->probe_fails : 3;

	sh += d->failback_fails < 4 ? d->failback_fails : 4;
	return base << sh;
}

/* ---- the context's list of failed-over QPs ----------------------------
 * fo[] has holes (NULL) so lock-free readers never miss a moved entry;
 * nfo is its high-water mark. Writers hold fo_lock. */
static pthread_mutex_t fo_lock = PTHREAD_MUTEX_INITIALIZER;

static int fo_add(struct shift_ctx *s, struct shift_dqp *d)
{
	int rc = -1;

	pthread_mutex_lock(&fo_lock);
	for (int i = 0; i < s->nfo; i++)
		if (__atomic_load_n(&s->fo[i], __ATOMIC_RELAXED) == d)
			rc = 0;
	for (int i = 0; rc && i < SHIFT_MAX_FO; i++) {
		if (i < s->nfo && s->fo[i])
			continue;
		__atomic_store_n(&s->fo[i], d, __ATOMIC_RELEASE);
		if (i == s->nfo)
			__atomic_store_n(&s->nfo, i + 1, __ATOMIC_RELEASE);
		rc = 0;
	}
	pthread_mutex_unlock(&fo_lock);
	return rc;
}

static void fo_remove(struct shift_ctx *s, struct shift_dqp *d)
{
	pthread_mutex_lock(&fo_lock);
	for (int i = 0; i < s->nfo; i++)
		if (s->fo[i] == d)
			__atomic_store_n(&s->fo[i], NULL, __ATOMIC_RELEASE);
	while (s->nfo && !s->fo[s->nfo - 1])
		s->nfo--;
	pthread_mutex_unlock(&fo_lock);
}

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
	int n = __atomic_load_n(&s->nfo, __ATOMIC_ACQUIRE);

	for (int i = 0; i < n; i++) {
		struct shift_dqp *d = __atomic_load_n(&s->fo[i], __ATOMIC_ACQUIRE);

		if (d && d->bk && d->bk->qp_num == bk_qpn)
			return d;
	}
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

/*
 * Post mirrored send WR idx again: on the backup QP (keys translated, wr_id
 * tagged for translation back) or, when failing back, on the default QP
 * exactly as the application posted it.
 */
static int post_mirrored(struct shift_dqp *d, uint64_t idx, bool dflt)
{
	struct shift_swqe *e = shift_dqp_swqe(d, idx);
	struct ibv_sge sge[e->num_sge ? e->num_sge : 1];
	struct ibv_send_wr wr, *bad;

	memset(&wr, 0, sizeof(wr));
	wr.wr_id = dflt ? e->wr_id : SHIFT_WRID_DATA | SHIFT_WRID_GEN(d->bk_gen) | idx;
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
		if (!dflt && local_keys(d, sge, e->num_sge)) {
			shift_debug("%s QP %u: no backup lkey for lkey %u", d->dev, d->qpn, sge[0].lkey);
			return -1;
		}
	}
	wr.sg_list = sge;
	if (e->opcode == IBV_WR_RDMA_WRITE || e->opcode == IBV_WR_RDMA_WRITE_WITH_IMM ||
	    e->opcode == IBV_WR_RDMA_READ) {
		wr.wr.rdma.remote_addr = e->remote_addr;
		uint64_t bytes = e->send_flags & IBV_SEND_INLINE ? e->inline_len : 0;

		for (unsigned k = 0; k < e->num_sge && !(e->send_flags & IBV_SEND_INLINE); k++)
			bytes += e->sge[k].length;
		/* a zero-length write touches no remote memory: its key is not used */
		if (!bytes || dflt)
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
		wr.wr.atomic.rkey = e->rkey;
		if (!dflt && remote_key(d, e->rkey, &wr.wr.atomic.rkey)) {
			shift_debug("%s QP %u: no backup rkey for the peer's rkey %u (atomic)", d->dev, d->qpn,
				    e->rkey);
			return -1;
		}
	}
	int rc = dflt ? d->prov_post_send(d->qp, &wr, &bad) : ibv_post_send(d->bk, &wr, &bad);
	if (rc) {
		shift_debug("%s QP %u: %s post_send: %s", d->dev, d->qpn, dflt ? "default" : "backup",
			    strerror(rc));
		return -1;
	}
	if (!dflt)
		d->retransmitted++;
	return 0;
}

/* The work completion opcode of a send WR's opcode. */
static enum ibv_wc_opcode send_wc_opcode(unsigned opcode)
{
	switch (opcode) {
	case IBV_WR_RDMA_READ:
		return IBV_WC_RDMA_READ;
	case IBV_WR_SEND:
	case IBV_WR_SEND_WITH_IMM:
	case IBV_WR_SEND_WITH_INV:
		return IBV_WC_SEND;
	case IBV_WR_ATOMIC_CMP_AND_SWP:
		return IBV_WC_COMP_SWAP;
	case IBV_WR_ATOMIC_FETCH_AND_ADD:
		return IBV_WC_FETCH_ADD;
	case IBV_WR_LOCAL_INV:
		return IBV_WC_LOCAL_INV;
	case IBV_WR_BIND_MW:
		return IBV_WC_BIND_MW;
	default:
		return IBV_WC_RDMA_WRITE;
	}
}

/* In place of mirrored send WR idx, which the peer has executed: an empty
 * WRITE on the backup QP, signaled like it, whose completion is idx's. */
static int post_bk_placeholder(struct shift_dqp *d, uint64_t idx)
{
	struct shift_swqe *e = shift_dqp_swqe(d, idx);
	struct ibv_send_wr wr, *bad;

	memset(&wr, 0, sizeof(wr));
	wr.wr_id = SHIFT_WRID_DATA | SHIFT_WRID_GEN(d->bk_gen) | idx;
	wr.opcode = IBV_WR_RDMA_WRITE;
	wr.send_flags = e->send_flags & IBV_SEND_SIGNALED;
	return ibv_post_send(d->bk, &wr, &bad);
}

static int post_bk_send(struct shift_dqp *d, uint64_t idx)
{
	return post_mirrored(d, idx, false);
}

static int post_bk_recv(struct shift_dqp *d, uint64_t idx)
{
	struct shift_rwqe *e = shift_dqp_rwqe(d, idx);
	struct ibv_sge sge[e->num_sge ? e->num_sge : 1];
	struct ibv_recv_wr wr = { .wr_id = SHIFT_WRID_DATA | SHIFT_WRID_RECV |
					   SHIFT_WRID_GEN(d->bk_gen) | idx,
				  .sg_list = sge, .num_sge = (int)e->num_sge }, *bad;

	memcpy(sge, e->sge, sizeof(struct ibv_sge) * e->num_sge);
	if (local_keys(d, sge, e->num_sge))
		return -1;
	return ibv_post_recv(d->bk, &wr, &bad) ? -1 : 0;
}

/* ---- failing over --------------------------------------------------------- */

static bool take_refused(struct shift_dqp *d, int rc, uint64_t sq_from, uint64_t rq_from);

static void give_up(struct shift_dqp *d, const char *why)
{
	if (d->send_state != SHIFT_SEND_UNPROTECTED)
		shift_warn("%s QP %u: cannot fail over (%s): the error goes to the application",
			   d->dev, d->qpn, why);
	shift_dqp_set_send_state(d, SHIFT_SEND_UNPROTECTED, why);
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

/*
 * Stale read-response state (soft-RoCE). rxe's completer remembers the
 * opcode of the last read response packet it accepted (FIRST or MIDDLE
 * while a multi-packet read response is coming in) and a QP reset does not
 * clear it (rxe_qp_reset clears the requester's and responder's opcodes,
 * not the completer's). A QP that went to ERR inside a read response and
 * was reset therefore refuses the ACK of its next WRITE or SEND as out of
 * sequence: it completes that WR with a success status (the WQE's status
 * was never set: the kernel's WARN_ON_ONCE in rxe_completer) and moves the
 * QP to ERR, so the WR after it completes flushed with no error before it.
 * Only a read response packet is accepted in that state, and a
 * RESPONSE_ONLY (an empty READ's) ends it. So after a failover with an
 * RDMA READ outstanding (the only way into that state), the first WR SHIFT
 * posts on the reset QP is an empty RDMA READ: the probe (prober), or one
 * ahead of the notification (the other end), or ahead of the handshake
 * message on a backup QP reset for a new episode. The application's own
 * READs prove the peer grants remote reads and read resources on that QP.
 */
static void empty_read(struct ibv_send_wr *wr, uint64_t wr_id, unsigned flags)
{
	memset(wr, 0, sizeof(*wr));
	wr->wr_id = wr_id;
	wr->opcode = IBV_WR_RDMA_READ;
	wr->send_flags = flags;
}

/* Is an RDMA READ among the outstanding send WRs (mirror synced)? */
static bool reads_outstanding(struct shift_dqp *d)
{
	for (uint64_t i = d->sq_tail; i < d->sq_head; i++)
		if (shift_dqp_swqe(d, i)->opcode == IBV_WR_RDMA_READ)
			return true;
	return false;
}

static int send_ctrl(struct shift_dqp *d, uint32_t imm)
{
	struct ibv_send_wr rd, wr, *bad;

	memset(&wr, 0, sizeof(wr));
	wr.wr_id = SHIFT_WRID_CTRL_SEND;
	wr.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
	wr.send_flags = IBV_SEND_SIGNALED;
	wr.imm_data = htobe32(imm);
	if (!d->bk_rd_stale)
		return ibv_post_send(d->bk, &wr, &bad);
	/* (its completions, if any, are CTRL_SEND's: SHIFT's own) */
	empty_read(&rd, SHIFT_WRID_CTRL_SEND, 0);
	rd.next = &wr;
	return ibv_post_send(d->bk, &rd, &bad);
}

/*
 * The connection cannot be saved (an atomic in flight at either end): the
 * application gets errors, as it would without SHIFT. The default QP goes
 * to ERR so its outstanding WRs flush to the application now, and WRs SHIFT
 * was holding for the backup complete with a flush error too.
 */
/*
 * The application's WRs SHIFT holds, from sq_from and rq_from to the heads
 * (their provider flushes were dropped, or the provider never had them),
 * complete with a flush error, each to the CQ of its queue (o is one of
 * them); err, the error that started it, in its place with its status. The
 * mirror retires them all.
 */
static void flush_held(struct shift_dqp *d, struct out *o, const struct ibv_wc *err,
		       uint64_t sq_from, uint64_t rq_from)
{
	struct out so = { .wc = NULL, .n = 0, .max = 0, .c = d->scq };
	struct out ro = { .wc = NULL, .n = 0, .max = 0, .c = d->rcq };
	struct out *os = d->scq == o->c ? o : &so, *orq = d->rcq == o->c ? o : &ro;

	for (uint64_t i = sq_from; i < d->sq_head; i++) {
		struct ibv_wc wc = { .wr_id = shift_dqp_swqe(d, i)->wr_id,
				     .status = IBV_WC_WR_FLUSH_ERR, .qp_num = d->qpn };
		if (err && i == sq_from && err->wr_id == wc.wr_id) {
			wc = *err;
			err = NULL;
		}
		emit(os, &wc);
	}
	shift_dqp_retire_all_send(d);
	for (uint64_t i = rq_from; i < d->rq_head; i++) {
		struct ibv_wc wc = { .wr_id = shift_dqp_rwqe(d, i)->wr_id,
				     .status = IBV_WC_WR_FLUSH_ERR, .qp_num = d->qpn,
				     .opcode = IBV_WC_RECV };
		if (err && i == rq_from && err->wr_id == wc.wr_id) {
			wc = *err;
			err = NULL;
		}
		emit(orq, &wc);
	}
	__atomic_store_n(&d->rq_tail, d->rq_head, __ATOMIC_RELAXED);
	shift_dqp_set_recv_state(d, SHIFT_RECV_DEFAULT, "held receives flushed");
	d->post_failed = false;
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

	(void)s;
	if (tell_peer && d->shadow &&
	    __atomic_load_n(&d->shadow->state, __ATOMIC_ACQUIRE) == SHIFT_SHADOW_READY) {
		if (!d->bk)
			d->bk = d->shadow->bk;
		d->ctrl_sent = send_ctrl(d, CTRL_ABORT) == 0;
	}
	shift_dqp_set_send_state(d, SHIFT_SEND_UNPROTECTED, "the connection cannot be saved");
	if (!held) {
		shift_lower->modify_qp(d->qp, &a, IBV_QP_STATE);
		return;
	}
	shift_dqp_sync(d);
	flush_held(d, o, err, d->sq_tail, d->rq_tail);
}

/*
 * A failover that cannot start after all on a QP whose refused posts SHIFT
 * took (shift_failover_post_refused): the provider never had those WRs, so
 * they complete with a flush error (after the ones it flushes itself, which
 * reach the application unfiltered from now on).
 */
static void give_up_taken(struct shift_dqp *d, struct out *o)
{
	if (!d->post_failed)
		return;
	flush_held(d, o, NULL, d->sq_taken, d->rq_taken);
}

static void poll_backup(struct shift_ctx *s, struct shift_cq *c, struct out *o, bool app);

/* ---- failover episodes ------------------------------------------------------
 *
 * Failover number k of a connection runs on backup QPs reset at both ends
 * for it: generation k - 1 (the replay is generation 0), whose PSNs both
 * ends derive alike, with a fresh control receive at the head of the
 * receive queue and no stale receive behind it. After a full failback each
 * end resets its own backup for the next failover. If the default path
 * fails again before that (one direction still on the backup, or the peer
 * not reset yet), the end that sees it flushes both its QPs, resets its
 * backup, and publishes the episode it started in the KV store; the peer,
 * which reads that record while its backup is used, does the same. A
 * handshake message is only sent to a backup reset for its episode: the
 * peer's record says so, or the peer's own message proves it.
 */

static bool app_sends(struct shift_ctx *s, struct shift_dqp *d);

static void ep_publish(struct shift_ctx *s, struct shift_dqp *d)
{
	struct shift_rnic *r = s->rnic;
	char key[SHIFT_EXCHANGE_KEY_MAX], val[64];
	int n;

	if (!r || !r->kv || shift_exchange_ep_key(&d->shadow->my_key, key, sizeof(key)) < 0)
		return;
	struct shift_ep_value ev = {
		.gen = d->bk_gen, .started = (unsigned)d->failovers,
		.ret = d->ret_ep && d->ret_ep == d->failovers, .count = d->ret_count,
		.bkfail = d->bk_error, .nosend = !app_sends(s, d),
	};

	n = shift_exchange_ep_encode_ex(&ev, val, sizeof(val));
	d->bkfail_published = d->bk_error;
	d->published_ep = d->failovers;
	if (n < 0 || shift_kv_put(r->kv, key, val, (size_t)n, 0))
		shift_warn("%s QP %u: cannot publish failover %lu in the KV store: the peer may not "
			   "follow it", d->dev, d->qpn, d->failovers);
	else
		shift_debug("%s QP %u: published %s = %.*s", d->dev, d->qpn, key, n, val);
}

/* A peer record read into d. */
static void ep_take(struct shift_dqp *d, const struct shift_ep_value *ev)
{
	d->peer_gen = ev->gen;
	d->peer_started = ev->started;
	d->peer_ret = ev->ret;
	d->peer_ret_count = ev->count;
	d->peer_bkfail = ev->bkfail;
	if (ev->nosend)
		d->peer_nosend = true; /* (as its handshake message says, which may be lost) */
}

/* The peer's record into d->peer_gen and d->peer_started: 0, or -1 (none,
 * or the store cannot be read: d keeps what it knew). */
static int ep_read(struct shift_ctx *s, struct shift_dqp *d)
{
	struct shift_rnic *r = s->rnic;
	char key[SHIFT_EXCHANGE_KEY_MAX];
	struct shift_ep_value ev;
	void *v;
	size_t len;

	if (!r || !r->kv || shift_exchange_ep_key(&d->shadow->peer_key, key, sizeof(key)) < 0)
		return -1;
	int rc = shift_kv_get(r->kv, key, &v, &len);

	__atomic_fetch_add(&shift_stats.ep_read_commands, 1, __ATOMIC_RELAXED);
	__atomic_fetch_add(&shift_stats.ep_records_read, 1, __ATOMIC_RELAXED);
	if (rc) {
		shift_debug("%s QP %u: no peer record %s (%d)", d->dev, d->qpn, key, rc);
		return -1;
	}
	rc = shift_exchange_ep_decode_ex(v, len, &ev);
	free(v);
	if (rc) {
		shift_debug("%s QP %u: peer record %s malformed", d->dev, d->qpn, key);
		return -1;
	}
	ep_take(d, &ev);
	return 0;
}

/* Does d read the peer's record at this pass (failback_work)? */
static bool ep_due(const struct shift_dqp *d, uint64_t now)
{
	return (d->need_rearm || d->wait_peer || d->wait_reset || d->bk_error || d->ret_wait) &&
	       now >= d->kv_at;
}

/*
 * The peers' records of ds[0..n) (n <= SHIFT_KV_MGET_MAX) in one KV read,
 * each taken into its QP (ep_take) and got[k] set if it was read: 0, or the
 * read's error (then none was).
 */
static int ep_mget(struct shift_ctx *s, struct shift_dqp **ds, size_t n, bool *got)
{
	char keys[SHIFT_KV_MGET_MAX][SHIFT_EXCHANGE_KEY_MAX];
	const char *kp[SHIFT_KV_MGET_MAX] = { NULL };
	void *v[SHIFT_KV_MGET_MAX];
	size_t len[SHIFT_KV_MGET_MAX];

	if (!n || n > SHIFT_KV_MGET_MAX)
		return -EINVAL;
	for (size_t k = 0; k < n; k++) {
		if (shift_exchange_ep_key(&ds[k]->shadow->peer_key, keys[k], sizeof(keys[k])) < 0)
			keys[k][0] = '\0'; /* (never there) */
		kp[k] = keys[k];
	}
	int rc = shift_kv_mget(s->rnic->kv, kp, n, v, len);

	__atomic_fetch_add(&shift_stats.ep_read_commands, 1, __ATOMIC_RELAXED);
	__atomic_fetch_add(&shift_stats.ep_records_read, n, __ATOMIC_RELAXED);
	for (size_t k = 0; k < n; k++) {
		struct shift_ep_value ev;

		got[k] = !rc && v[k] && keys[k][0] && !shift_exchange_ep_decode_ex(v[k], len[k], &ev);
		if (got[k])
			ep_take(ds[k], &ev);
		free(v[k]);
	}
	return rc;
}

/*
 * The peer records of every failed-over QP of s that reads it at this pass,
 * in one KV command per SHIFT_KV_MGET_MAX QPs instead of one each (after a
 * NIC failure every QP on it reads its record at each probe period):
 * failback_work() then takes d->kv_pref (1 read, -1 none or unreadable)
 * instead of reading. Background pass, slow_lock held.
 */
static void ep_prefetch(struct shift_ctx *s, int nfo, uint64_t now)
{
	struct shift_rnic *r = s->rnic;
	struct shift_dqp *ds[SHIFT_KV_MGET_MAX];
	bool got[SHIFT_KV_MGET_MAX];
	int i = 0;

	bool any = false;

	if (!r || !r->kv)
		return;
	for (int k = 0; k < nfo && !any; k++) {
		struct shift_dqp *d = __atomic_load_n(&s->fo[k], __ATOMIC_ACQUIRE);

		any = d && ep_due(d, now);
	}
	if (!any)
		return;
	while (i < nfo) {
		size_t n = 0;

		for (; i < nfo && n < SHIFT_KV_MGET_MAX; i++) {
			struct shift_dqp *d = __atomic_load_n(&s->fo[i], __ATOMIC_ACQUIRE);

			/* due, or due within half its period: read with the
			 * others (the schedules of QPs that failed over
			 * together line up after one batch) */
			if (!d || !d->scq || !d->shadow || d->send_state == SHIFT_SEND_UNPROTECTED ||
			    !ep_due(d, now + probe_wait(d) / 2))
				continue;
			ds[n++] = d;
		}
		if (n < 2)
			continue; /* (one alone reads its own) */
		int rc = ep_mget(s, ds, n, got);

		for (size_t k = 0; k < n; k++)
			ds[k]->kv_pref = got[k] ? 1 : -1;
		shift_debug("%s: %zu peer records in one KV read (%d)", ds[0]->dev, n, rc);
	}
}

/* ep_read(), or what ep_prefetch() read for d at this pass. */
static int ep_read_pass(struct shift_ctx *s, struct shift_dqp *d)
{
	int8_t p = d->kv_pref;

	d->kv_pref = 0;
	return p ? (p > 0 ? 0 : -1) : ep_read(s, d);
}

/* Is the peer's backup reset for my current episode? */
static bool peer_armed(const struct shift_dqp *d)
{
	return d->failovers <= 1 || d->peer_gen + 1 >= (unsigned)d->failovers;
}

/* Has the peer stopped the backup QP of its last failover (so a reset of
 * mine cannot acknowledge its packets as duplicates)? It joined my
 * failover, or it reset its own for it. */
static bool peer_old_dead(const struct shift_dqp *d)
{
	return d->peer_started >= (unsigned)d->failovers || d->peer_gen + 1 >= (unsigned)d->failovers;
}

/*
 * Stop my backup QP (ERR) and drain its CQs of d: successes are the
 * application's (kept, in order) when keep, else dropped with d off the
 * failed-over list; errors and flushes are SHIFT's. Its CQs locked.
 */
/*
 * Pokes. An end that fails over alone (the peer's retry budget outlasted
 * the fault, so its QP never failed) reaches the peer through its handshake
 * message on the backup path. If its backup NIC dies before that message
 * arrives, the peer never learns of the failover: it stays on its default
 * QP, which still answers the old connection's PSNs, so even a probe of the
 * default path may be answered (as a duplicate) while the two ends no longer
 * agree on anything. Such an end is "unjoined": it neither probes nor
 * restarts its failover; it pokes the peer instead, writing under the
 * peer's poke key (its default GID), and publishes its record. Every
 * process reads the poke keys of its contexts' default GIDs every
 * SHIFT_POKE_MS (one KV read per context); when a value changes it reads
 * the peer records of its Default-state QPs on that GID, and a QP whose
 * peer started a failover it never saw follows it (start(), its number
 * taken from the peer). From there on it is the failover both ends saw,
 * whose backup path failed: both ends publish that, the prober probes the
 * reset default QPs, and both go back to them (ret_start).
 */
static bool unjoined(const struct shift_dqp *d)
{
	return d->bk_error && !d->handshake_done && d->peer_started < d->failovers;
}

static void poke_peer(struct shift_ctx *s, struct shift_dqp *d)
{
	struct shift_rnic *r = s->rnic;
	char key[SHIFT_EXCHANGE_KEY_MAX], val[48];
	int n;

	if (!r || !r->kv || !shift_config.poke_ms ||
	    shift_exchange_poke_key(&d->shadow->peer_key.gid, key, sizeof(key)) < 0)
		return;
	n = snprintf(val, sizeof(val), "%u.%lu.%llu", d->qpn, d->failovers,
		     (unsigned long long)mono_us());
	if (n < 0 || (size_t)n >= sizeof(val) || shift_kv_put(r->kv, key, val, (size_t)n, 0))
		return; /* (again at the next pass) */
	d->poked_ep = d->failovers;
	shift_info("%s QP %u: my backup path failed before the peer answered failover %lu: "
		   "asking the peer to follow it (%s)", d->dev, d->qpn, d->failovers, key);
}

static void flush_backup(struct shift_ctx *s, struct shift_dqp *d, bool keep)
{
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_ERR };
	struct shift_cq *cs[2] = { d->scq, d->rcq != d->scq ? d->rcq : NULL };

	if (!keep)
		fo_remove(s, d);
	shift_lower->modify_qp(d->bk, &a, IBV_QP_STATE);
	d->bk_flushing = true;
	for (int k = 0; k < 2; k++) {
		if (!cs[k])
			continue;
		struct out o = { .wc = NULL, .n = 0, .max = 0, .c = cs[k] };
		poll_backup(s, cs[k], &o, false);
	}
	d->bk_flushing = false;
}

/* Reset my (stopped) backup QP as generation gen, with a fresh control
 * receive, and publish it. Its CQs locked. */
static int reset_backup(struct shift_ctx *s, struct shift_dqp *d, unsigned gen)
{
	d->handshake_done = false;
	d->ctrl_sent = false;
	d->bk_error = false;
	d->bk_gen = gen & 0x3fffu;
	if (shift_shadow_rearm(s->rnic, d->shadow, gen)) {
		give_up(d, "its backup QP could not be reset for the next failover");
		return -1;
	}
	d->need_rearm = false;
	d->last_switch_s = shift_clock_wall_s();
	ep_publish(s, d);
	return 0;
}

/* After a full failback: both directions left the backup QP, whose last
 * packets were all acknowledged: reset it for the next failover. */
static int rearm_backup(struct shift_ctx *s, struct shift_dqp *d)
{
	flush_backup(s, d, false);
	return reset_backup(s, d, (unsigned)d->failovers);
}

static void send_my_ctrl(struct shift_ctx *s, struct shift_dqp *d);
static int finish_start(struct shift_ctx *s, struct shift_dqp *d, bool reset);

/* Did the application bring its QP to RTS (can it ever send)? */
static bool app_sends(struct shift_ctx *s, struct shift_dqp *d)
{
	bool yes;

	pthread_mutex_lock(&s->rnic->lock);
	yes = (d->shadow->attr_mask & IBV_QP_SQ_PSN) != 0;
	pthread_mutex_unlock(&s->rnic->lock);
	return yes;
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
	/* my backup served the last failover and was not reset since: the
	 * default path failed again before the failback finished at both
	 * ends (or it never did) */
	bool again = d->need_rearm;

	if (d->send_state == SHIFT_SEND_UNPROTECTED)
		return -1;
	if (d->send_state != SHIFT_SEND_DEFAULT && !again)
		return 0;
	if (!d->shadow || !d->scq || !d->rcq ||
	    __atomic_load_n(&d->shadow->state, __ATOMIC_ACQUIRE) != SHIFT_SHADOW_READY) {
		give_up(d, "its backup QP is not ready");
		give_up_taken(d, o);
		return -1;
	}
	if (fo_add(s, d)) {
		give_up(d, "too many failed-over QPs in this context");
		give_up_taken(d, o);
		return -1;
	}
	d->bk = d->shadow->bk;
	/* posters hold everything from here: sends until the handshake,
	 * receives until they are reposted below, in order */
	shift_dqp_lock(d);
	d->handshake_done = false;
	d->recv_hold = true;
	d->post_failed = false; /* (its WRs are in the mirror like the others) */
	shift_dqp_set_send_state(d, SHIFT_SEND_FALLBACK, "failover");
	shift_dqp_set_recv_state(d, SHIFT_RECV_FALLBACK, "failover");
	shift_dqp_unlock(d);
	shift_lower->modify_qp(d->qp, &a, IBV_QP_STATE);
	d->t_error_us = mono_us();
	d->switch_us = d->fallback_us = 0;
	d->dflt = SHIFT_DFLT_ERR;
	d->probe_fails = 0;
	d->probe_at = fb_now() + probe_wait(d);
	d->notify_pending = false;
	d->notify_inflight = false; /* (its flush, if any, is SHIFT's) */
	d->notify_sent = false;     /* (the peer resets its default QP again) */
	d->ret_wait = false;
	d->wait_peer = false;
	d->last_switch_s = shift_clock_wall_s();
	shift_ctx_set_slow(s, true);
	if (again) {
		/* completions of the old backup first: older than the default
		 * QP's in each queue (a direction left it only once drained) */
		shift_info("%s QP %u: the default path failed again before the backup QP was reset: "
			   "both QPs stopped for failover %lu", d->dev, d->qpn, d->failovers + 1);
		flush_backup(s, d, true);
	}
	d->need_rearm = true;
	drain_default(s, d->scq, o);
	if (d->rcq != d->scq)
		drain_default(s, d->rcq, o);
	/* The boundary, judged only now: an atomic whose successful completion
	 * was still in the default CQ is done, not in flight. The QP's error
	 * and flush completions were dropped by the drain: the application
	 * gets its outstanding WRs flushed (fail_connection, held). */
	shift_dqp_sync(d);
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
	if (reads_outstanding(d)) {
		/* either QP may have stopped inside a read response */
		d->dflt_rd_stale = true;
		if (again)
			d->bk_rd_stale = true;
	}
	d->failovers++;
	d->wait_since = fb_now();
	if (again && !peer_old_dead(d) && (ep_read(s, d), !peer_old_dead(d))) {
		/* the peer's old backup may still send: reset mine only once
		 * it has stopped it (it follows my record) */
		d->wait_reset = true;
		d->kv_at = 0;
		ep_publish(s, d);
		shift_info("%s QP %u: failover %lu waits for the peer to stop its backup QP", d->dev,
			   d->qpn, d->failovers);
		return 0;
	}
	if (finish_start(s, d, again) && d->send_state == SHIFT_SEND_UNPROTECTED) {
		/* the default QP's flushes were dropped above: the
		 * application gets its outstanding WRs back as flushes */
		shift_dqp_sync(d);
		flush_held(d, o, err, d->sq_tail, d->rq_tail);
		return -2;
	}
	return 0;
	shift_debug("%s QP %u: sq %llu..%llu, rq %llu..%llu, recv consumers posted %llu", d->dev, d->qpn,
		    (unsigned long long)d->sq_tail, (unsigned long long)d->sq_head,
		    (unsigned long long)d->rq_tail, (unsigned long long)d->rq_head,
		    (unsigned long long)shift_dqp_consumers_posted(d));
	return 0;
}

/* The rest of start(), once my backup QP may be (re)set: my receives on
 * it, my record, my handshake message (or a wait for the peer's backup). */
static int finish_start(struct shift_ctx *s, struct shift_dqp *d, bool reset)
{
	d->wait_reset = false;
	if (reset && reset_backup(s, d, (unsigned)d->failovers - 1)) {
		d->recv_hold = false;
		return -1;
	}
	d->need_rearm = true; /* this failover uses it */
	shift_dqp_lock(d);
	for (uint64_t i = d->rq_tail; i < d->rq_head; i++) {
		if (post_bk_recv(d, i)) {
			d->recv_hold = false;
			shift_dqp_unlock(d);
			give_up(d, "cannot repost a receive on the backup QP");
			return -1;
		}
	}
	d->recv_hold = false;
	shift_dqp_unlock(d);
	if (d->failovers > 1) {
		if (!reset) /* (reset_backup() published it) */
			ep_publish(s, d);
		if (!peer_armed(d))
			(void)ep_read(s, d);
	}
	shift_info("%s QP %u: failing over to backup QP %u (receive counter %u, failover %lu)",
		   d->dev, d->qpn, d->bk->qp_num, (uint32_t)d->rq_tail, d->failovers);
	if (peer_armed(d)) {
		send_my_ctrl(s, d);
	} else {
		/* the peer's backup still serves the last failover: it reads
		 * my record and answers first, or its record says it is ready */
		d->wait_peer = true;
		d->kv_at = 0;
		shift_info("%s QP %u: waiting for the peer to reset its backup QP for failover %lu",
			   d->dev, d->qpn, d->failovers);
	}
	return d->send_state == SHIFT_SEND_UNPROTECTED ? -1 : 0;
}

/* My handshake message of this failover: my receive counter. */
static void send_my_ctrl(struct shift_ctx *s, struct shift_dqp *d)
{
	d->wait_peer = false;
	if (send_ctrl(d, CTRL_COUNT((uint32_t)d->rq_tail) | (app_sends(s, d) ? 0 : CTRL_NOSEND))) {
		give_up(d, "cannot send the handshake message");
		return;
	}
	d->ctrl_sent = true;
}

/*
 * The outstanding send WRs (sq synced) that the peer has executed, by its
 * receive counter (compared under mask, the bits the counter carries): my
 * consumers done before them plus those among them make the counter, so
 * they end with the peer_count - done -th consumer: returns the index after
 * it (sq_tail if none). *rd is the first RDMA READ among them (UINT64_MAX if
 * none), *done_out my consumers done before them.
 */
static uint64_t executed_end(struct shift_dqp *d, uint32_t peer_count, uint32_t mask,
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
static void complete_executed(struct shift_dqp *d, struct out *os, uint64_t i)
{
	struct shift_swqe *e = shift_dqp_swqe(d, i);

	if ((e->send_flags & IBV_SEND_SIGNALED) || d->sq_sig_all) {
		struct ibv_wc wc = {
			.wr_id = e->wr_id, .status = IBV_WC_SUCCESS,
			.opcode = send_wc_opcode(e->opcode), .qp_num = d->qpn,
		};
		shift_dqp_retire(d, &wc); /* sq_tail follows at the next sync */
		emit(os, &wc);
	}
}

/* Both messages exchanged: retransmit what the peer has not executed. */
static void retransmit(struct shift_dqp *d, struct out *o)
{
	uint64_t rd, i;
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
	uint64_t end = executed_end(d, d->peer_recv_count, CTRL_COUNT(~0u), &rd, NULL);

	for (i = d->sq_tail; i < end && i < rd; i++)
		complete_executed(d, os, i);
	unsigned long before = d->retransmitted;
	uint64_t skipped = end - d->sq_tail;

	shift_dqp_lock(d);
	d->handshake_done = true;
	for (; i < end; i++) {
		bool again = shift_dqp_swqe(d, i)->opcode == IBV_WR_RDMA_READ;

		if (again ? post_bk_send(d, i) : post_bk_placeholder(d, i)) {
			shift_dqp_unlock(d);
			give_up(d, "cannot post a WR on the backup QP");
			return;
		}
		skipped -= again;
	}
	for (; i < d->sq_head; i++) {
		if (post_bk_send(d, i)) {
			shift_dqp_unlock(d);
			give_up(d, "cannot post a WR on the backup QP");
			return;
		}
	}
	shift_dqp_unlock(d);
	d->switch_us = mono_us() - d->t_error_us;
	shift_info("%s QP %u: on backup QP %u (failover %lu): %lu WRs retransmitted, %llu already "
		   "executed at the peer completed, switch time %llu us", d->dev, d->qpn, d->bk->qp_num,
		   d->failovers, d->retransmitted - before, (unsigned long long)skipped,
		   (unsigned long long)d->switch_us);
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
	/* waiting for the peer's backup: its message proves it is ready */
	if (d->send_state != SHIFT_SEND_UNPROTECTED && !d->ctrl_sent)
		send_my_ctrl(s, d);
	if (d->send_state != SHIFT_SEND_UNPROTECTED && !d->handshake_done)
		retransmit(d, o);
}

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

static void poll_backup(struct shift_ctx *s, struct shift_cq *c, struct out *o, bool app);

/* 1: the port is ACTIVE, 0: it is not, -1: it cannot be queried. */
static int port_state(struct shift_ctx *s, unsigned port)
{
	struct ibv_port_attr pa;

	memset(&pa, 0, sizeof(pa));
	if (shift_lower->query_port(s->ibctx, (uint8_t)port, &pa))
		return -1;
	return pa.state == IBV_PORT_ACTIVE;
}

static bool port_active(struct shift_ctx *s, struct shift_dqp *d)
{
	uint8_t port = d->shadow && d->shadow->attr.port_num ? d->shadow->attr.port_num : 1;

	return port_state(s, port) == 1;
}

/* The backup QP's port (the default QP's number, on the backup NIC). */
static bool bk_port_active(struct shift_ctx *s, struct shift_dqp *d)
{
	struct ibv_port_attr pa;
	uint8_t port = d->shadow && d->shadow->attr.port_num ? d->shadow->attr.port_num : 1;

	memset(&pa, 0, sizeof(pa));
	return s->rnic && s->rnic->bk_ctx && !shift_lower->query_port(s->rnic->bk_ctx, port, &pa) &&
	       pa.state == IBV_PORT_ACTIVE;
}

static int reset_default(struct shift_ctx *s, struct shift_dqp *d)
{
	struct shift_rnic *r = s->rnic;
	struct ibv_qp_attr app;
	struct ibv_recv_wr rwr = { .wr_id = SHIFT_WRID_CTRL_RECV }, *rbad;
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
	if (shift_qp_reset(d->qp) || shift_qp_to_init(d->qp, &app, app.port_num))
		return -1;
	/* the peer's failback notification consumes this, ahead of the
	 * application's receives reposted after it */
	if (d->prov_post_recv(d->qp, &rwr, &rbad))
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
static bool prober(struct shift_dqp *d)
{
	const struct shift_qp_key *me = &d->shadow->my_key, *peer = &d->shadow->peer_key;
	int c;

	if (d->peer_nosend)
		return true;
	c = memcmp(me->gid.raw, peer->gid.raw, sizeof(me->gid.raw));
	return c < 0 || (c == 0 && me->qpn < peer->qpn);
}

static int post_probe(struct shift_dqp *d)
{
	struct ibv_send_wr wr, *bad;

	if (d->dflt_rd_stale) {
		/* an empty READ: its response is the only one a completer
		 * left inside a read response accepts (stale_read_state) */
		empty_read(&wr, SHIFT_WRID_PROBE, IBV_SEND_SIGNALED);
		return d->prov_post_send(d->qp, &wr, &bad);
	}
	memset(&wr, 0, sizeof(wr));
	wr.wr_id = SHIFT_WRID_PROBE;
	wr.opcode = IBV_WR_RDMA_WRITE;
	wr.send_flags = IBV_SEND_SIGNALED;
	return d->prov_post_send(d->qp, &wr, &bad);
}

/* My outstanding receives go to the default QP, as the application posted
 * them: receive state Default. post_lock held. 0, or -1 (given up). */
static int receives_back(struct shift_dqp *d)
{
	for (uint64_t i = d->rq_tail; i < d->rq_head; i++) {
		struct shift_rwqe *e = shift_dqp_rwqe(d, i);
		struct ibv_recv_wr wr = { .wr_id = e->wr_id, .sg_list = e->sge,
					  .num_sge = (int)e->num_sge }, *bad;

		int rc = d->prov_post_recv(d->qp, &wr, &bad);

		if (rc && take_refused(d, rc, d->sq_head, i)) {
			/* it failed again: the next failover reposts them */
			shift_info("%s QP %u: the default QP failed again while my receives moved back",
				   d->dev, d->qpn);
			break;
		}
		if (rc) {
			give_up(d, "the default QP refused a receive while failing back");
			return -1;
		}
	}
	shift_dqp_set_recv_state(d, SHIFT_RECV_DEFAULT, "receives back on the default QP");
	return 0;
}

/* The default path failed again before the switch: the WRs held for it go
 * to the backup after all. post_lock held. */
static void fallback_again(struct shift_dqp *d)
{
	uint64_t first = d->send_state == SHIFT_SEND_WAIT_DRAINED ? d->fence + 1 : d->sq_head;

	shift_dqp_set_send_state(d, SHIFT_SEND_FALLBACK, "the default path failed again");
	d->dflt = SHIFT_DFLT_ERR;
	d->probe_at = fb_now() + probe_wait(d);
	for (uint64_t i = first; i < d->sq_head; i++) {
		if (post_bk_send(d, i)) {
			give_up(d, "cannot post a WR on the backup QP");
			return;
		}
	}
}

/* Send side back to the default QP: the notification, then the held WRs.
 * post_lock held. */
static void switch_back(struct shift_dqp *d)
{
	uint64_t first = d->send_state == SHIFT_SEND_WAIT_DRAINED ? d->fence + 1 : d->sq_head;
	uint64_t held = 0, i;
	struct ibv_send_wr wr, *bad;

	for (i = first; i < d->sq_head; i++)
		held += shift_wr_consumes_recv(shift_dqp_swqe(d, i)->opcode);
	memset(&wr, 0, sizeof(wr));
	wr.wr_id = SHIFT_WRID_NOTIFY;
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
		empty_read(&rd, SHIFT_WRID_NOTIFY_READ, 0);
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
 * and the send side is back (Default). post_lock held. */
static void notified(struct shift_dqp *d)
{
	uint64_t first = d->fence + 1;

	for (uint64_t i = first; i < d->sq_head; i++) {
		int rc = post_mirrored(d, i, true);

		if (rc && take_refused(d, rc, i, d->rq_head)) {
			/* it failed again: the next failover retransmits them */
			shift_info("%s QP %u: the default QP failed again while my held WRs moved back",
				   d->dev, d->qpn);
			break;
		}
		if (rc) {
			give_up(d, "the default QP refused a WR while failing back");
			return;
		}
	}
	shift_dqp_set_send_state(d, SHIFT_SEND_DEFAULT, "failback done");
	d->failbacks++;
	d->failback_fails = 0;
	bool rd = d->dflt_rd_stale;

	d->dflt_rd_stale = false; /* an empty READ or the probe went first */
	d->last_switch_s = shift_clock_wall_s();
	/* a receive-only peer sends nothing, no notification either */
	if (d->peer_nosend && d->recv_state == SHIFT_RECV_FALLBACK)
		receives_back(d);
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
	if (d->send_state == SHIFT_SEND_FALLBACK) {
		shift_dqp_sync_locked(d);
		if (d->sq_tail == d->sq_head) {
			switch_back(d);
		} else if (shift_dqp_signaled(d, d->sq_head - 1)) {
			/* the last outstanding WR is signaled: it is the fence */
			d->fence = d->sq_head - 1;
			shift_dqp_set_send_state(d, SHIFT_SEND_WAIT_DRAINED, "fence posted");
		} else {
			shift_dqp_set_send_state(d, SHIFT_SEND_WAIT_SIGNALED, "failback: waiting for a signaled WR");
		}
	}
	shift_dqp_unlock(d);
}

/* The peer's notification arrived on my default QP: once its backup sends
 * are all accounted for, my remaining receives move to the default QP. */
static void try_notify(struct shift_dqp *d)
{
	uint32_t behind = CTRL_COUNT(d->notify_count - (uint32_t)d->rq_tail);

	if (!d->notify_pending)
		return;
	if (behind && behind < (1u << 29))
		return; /* backup receive completions still to come */
	if (behind)
		shift_warn("%s QP %u: consumed more receives (%u) than the peer sent on the backup (%u)",
			   d->dev, d->qpn, CTRL_COUNT((uint32_t)d->rq_tail), d->notify_count);
	shift_dqp_lock(d);
	int rc = receives_back(d);
	d->notify_pending = false;
	shift_dqp_unlock(d);
	if (rc)
		return;
	shift_info("%s QP %u: receives back on the default QP (%llu reposted)", d->dev, d->qpn,
		   (unsigned long long)(d->rq_head - d->rq_tail));
}

/* SHIFT's own completions on a default QP that has failed over. */
static void on_default_ctrl(struct shift_ctx *s, struct shift_dqp *d, struct ibv_wc *wc,
			    struct out *o)
{
	switch (wc->wr_id) {
	case SHIFT_WRID_PROBE:
		if (wc->status == IBV_WC_SUCCESS) {
			bool rd = d->dflt_rd_stale;

			d->dflt_rd_stale = false; /* (an empty READ, if it was) */
			probe_ok(d, rd ? "probe, an empty READ" : "probe");
		} else {
			d->dflt = SHIFT_DFLT_ERR;
			d->probe_fails++;
			d->probe_at = fb_now() + probe_wait(d);
			shift_debug("%s QP %u: probe failed (%d)", d->dev, d->qpn, (int)wc->status);
		}
		return;
	case SHIFT_WRID_CTRL_RECV:
		d->ctrl_recv_out = false;
		if (wc->status != IBV_WC_SUCCESS && wc->status != IBV_WC_WR_FLUSH_ERR)
			shift_debug("%s QP %u: SHIFT's receive on the default QP failed: %d (opcode %d)",
				    d->dev, d->qpn, (int)wc->status, (int)wc->opcode);
		if (wc->status != IBV_WC_SUCCESS || d->recv_state != SHIFT_RECV_FALLBACK)
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
		d->notify_pending = true;
		/* the prober's notification came over the default path: it
		 * works both ways (its ACK went back), my sends may follow */
		if (d->send_state == SHIFT_SEND_FALLBACK && d->handshake_done &&
		    d->dflt == SHIFT_DFLT_READY && !prober(d))
			probe_ok(d, "the peer's failback notification");
		if (d->rcq)
			poll_backup(s, d->rcq, o, false);
		try_notify(d);
		return;
	case SHIFT_WRID_NOTIFY_READ:
		if (wc->status == IBV_WC_SUCCESS)
			return; /* (a QP that signals all WRs) */
		/* fall through - its failure is the notification's */
	default: /* the notification's own completion */
		if (!d->notify_inflight)
			return;
		d->notify_inflight = false;
		if (wc->status == IBV_WC_SUCCESS) {
			shift_dqp_lock(d);
			if (d->send_state == SHIFT_SEND_WAIT_DRAINED)
				notified(d);
			shift_dqp_unlock(d);
			return;
		}
		if (d->failback_fails < 64)
			d->failback_fails++;
		shift_info("%s QP %u: failback notification failed (%d): the default path failed again "
			   "(next probe in %llu %s)", d->dev, d->qpn, (int)wc->status,
			   (unsigned long long)probe_wait(d), "ms");
		/* the peer may have executed it (its ACK lost) and moved its
		 * receives: only a new failover on reset backups is safe */
		if (d->send_state == SHIFT_SEND_WAIT_DRAINED)
			start(s, d, o, NULL);
		return;
	}
}

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
 * - ret_start(): the end that sees its backup fail with its default path
 *   proven (its probe answered), or that reads the peer's return record,
 *   stops its backup QP (its successful completions kept), reposts its
 *   outstanding receives on the default QP, and publishes failover k+1 as
 *   a return, with its receive counter.
 * - ret_finish(): once the peer's return record for k+1 is read, its
 *   receives are on its default QP: my sends that were on the backup or
 *   held go to the default QP, those the peer's counter shows executed
 *   completed instead, as in retransmit(). If my failback notification has
 *   not consumed the peer's control receive (posted at its default reset,
 *   at the head of its receive queue), an empty WRITE_WITH_IMM goes first
 *   to consume it.
 *
 * The backup is re-armed later as after a failback. An atomic among the WRs
 * to move fails the connection, as in a failover.
 */
static int ret_start(struct shift_ctx *s, struct shift_dqp *d, struct out *o)
{
	if (d->dflt == SHIFT_DFLT_ERR) {
		/* (the follower: its default QP must take the WRs) */
		int rc = reset_default(s, d);

		if (rc < 0)
			return -1;
		d->dflt = SHIFT_DFLT_READY;
	}
	shift_dqp_lock(d);
	d->recv_hold = true;
	if (d->send_state != SHIFT_SEND_DEFAULT) {
		d->handshake_done = false; /* sends held until ret_finish() */
		shift_dqp_set_send_state(d, SHIFT_SEND_FALLBACK, "return episode");
	}
	shift_dqp_unlock(d);
	/* the backup's successful completions first, its errors dropped */
	flush_backup(s, d, true);
	d->bk_error = false;
	d->wait_peer = d->wait_reset = false;
	d->notify_pending = false;
	shift_dqp_sync(d);
	for (uint64_t i = d->sq_tail; i < d->sq_head && d->send_state != SHIFT_SEND_DEFAULT; i++) {
		if (shift_wr_is_atomic(shift_dqp_swqe(d, i)->opcode)) {
			d->atomic_boundary_hit = true;
			shift_warn("%s QP %u: cannot go back to the default QP (an atomic was in flight "
				   "on the failed backup): the error goes to the application", d->dev,
				   d->qpn);
			d->recv_hold = false;
			fail_connection(s, d, o, false, NULL);
			return -2;
		}
	}
	shift_dqp_lock(d);
	int rc = d->recv_state == SHIFT_RECV_FALLBACK ? receives_back(d) : 0;

	d->recv_hold = false;
	shift_dqp_unlock(d);
	if (rc)
		return -1;
	d->failovers++;
	d->ret_wait = true;
	d->ret_ep = d->failovers;
	d->ret_count = (uint32_t)d->rq_tail;
	d->wait_since = fb_now();
	d->kv_at = 0;
	d->last_switch_s = shift_clock_wall_s();
	ep_publish(s, d);
	shift_info("%s QP %u: the backup path failed, the default path works: back to the default "
		   "QP (failover %lu, receive counter %u)", d->dev, d->qpn, d->failovers,
		   (uint32_t)d->rq_tail);
	return 0;
}

static void ret_finish(struct shift_ctx *s, struct shift_dqp *d, struct out *o)
{
	uint64_t moved = 0, done_n = 0;

	d->ret_wait = false;
	shift_dqp_lock(d);
	if (d->send_state != SHIFT_SEND_DEFAULT) {
		uint64_t rd, i;
		uint32_t done;
		struct out so = { .wc = NULL, .n = 0, .max = 0, .c = d->scq };
		struct out *os = o->c == d->scq ? o : &so;

		shift_dqp_sync_locked(d);
		uint64_t end = executed_end(d, d->peer_ret_count, ~0u, &rd, &done);

		if (!d->notify_sent) {
			/* the peer's control receive heads its queue: consume it */
			struct ibv_send_wr wr, *bad;

			memset(&wr, 0, sizeof(wr));
			wr.wr_id = SHIFT_WRID_NOTIFY;
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
			 * after that consumer (retransmit() keeps the order with
			 * placeholders on the backup, gone here) */
			shift_dqp_unlock(d);
			shift_warn("%s QP %u: an RDMA READ may have lost its response: the error "
				   "goes to the application", d->dev, d->qpn);
			fail_connection(s, d, o, false, NULL);
			return;
		}
		for (i = d->sq_tail; i < end; i++, done_n++)
			complete_executed(d, os, i);
		for (; i < d->sq_head; i++) {
			int rc = post_mirrored(d, i, true);

			if (rc && take_refused(d, rc, i, d->rq_head))
				break; /* it failed again: the next failover */
			if (rc) {
				shift_dqp_unlock(d);
				give_up(d, "the default QP refused a WR");
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
	d->failbacks++;
	d->failback_fails = 0;
	d->switch_us = d->t_error_us ? mono_us() - d->t_error_us : 0;
	d->last_switch_s = shift_clock_wall_s();
	shift_info("%s QP %u: back on the default QP after the backup failed (failover %lu): %llu "
		   "WRs moved there, %llu already executed at the peer completed", d->dev, d->qpn,
		   d->failovers, (unsigned long long)moved, (unsigned long long)done_n);
}

/* The background thread's failback work for one failed-over QP (its CQs
 * locked). */
static void failback_work(struct shift_ctx *s, struct shift_dqp *d, uint64_t now)
{
	struct ibv_wc tmp[TMP_WC];
	int n;

	if (d->send_state == SHIFT_SEND_UNPROTECTED)
		return; /* its completions are the application's, as they come */
	/* completions on the default CQs: a passive application may never
	 * poll them (the probe's, the peer's notification) */
	struct shift_cq *cs[2] = { d->scq, d->rcq != d->scq ? d->rcq : NULL };
	for (int k = 0; k < 2; k++) {
		if (!cs[k])
			continue;
		struct out o = { .wc = NULL, .n = 0, .max = 0, .c = cs[k] };
		/* as a batch: an error in it that starts a failover drains
		 * the rest of it first (from_default_batch) */
		while ((n = s->poll_cq(cs[k]->app, TMP_WC, tmp)) > 0)
			from_default_batch(s, tmp, (size_t)n, &o);
	}
	if (d->send_state == SHIFT_SEND_UNPROTECTED)
		return;
	/* Episodes: while my backup is used (the peer's message cannot reach
	 * it), read the peer's record at the probe period; waiting for the
	 * peer, or after a backup failure, at every pass. */
	if (ep_due(d, now) || d->kv_pref) {
		bool urgent = d->wait_peer || d->wait_reset || d->bk_error;

		d->kv_at = now + (urgent ? 1 : probe_wait(d));
		if (ep_read_pass(s, d) == 0) {
			struct out o = { .wc = NULL, .n = 0, .max = 0, .c = d->scq };

			if (d->peer_started > d->failovers && d->peer_ret &&
			    d->peer_started == d->failovers + 1) {
				/* (my default QP must be reset first: not while
				 * its port is down) */
				bool can = d->dflt != SHIFT_DFLT_ERR || port_active(s, d);

				if (d->followed_ep != d->peer_started)
					shift_info("%s QP %u: the peer goes back to the default QP (failover "
						   "%u): following it%s", d->dev, d->qpn, d->peer_started,
						   can ? "" : " once my default port is up");
				d->followed_ep = d->peer_started;
				if (can && ret_start(s, d, &o) == 0 && d->peer_started == d->failovers)
					ret_finish(s, d, &o);
			} else if (d->ret_wait && d->peer_ret && d->peer_started == d->failovers) {
				ret_finish(s, d, &o);
			} else if (d->peer_started > d->failovers) {
				shift_info("%s QP %u: the peer started failover %u: following it", d->dev,
					   d->qpn, d->peer_started);
				if (d->send_state != SHIFT_SEND_DEFAULT)
					d->need_rearm = true; /* a new failover from any state */
				d->ret_wait = false;
				start(s, d, &o, NULL);
			} else if (d->wait_reset && peer_old_dead(d)) {
				if (finish_start(s, d, true) && d->send_state == SHIFT_SEND_UNPROTECTED) {
					shift_dqp_sync(d);
					flush_held(d, &o, NULL, d->sq_tail, d->rq_tail);
				}
				if (d->ctrl_pending && d->send_state != SHIFT_SEND_UNPROTECTED)
					on_ctrl(s, d, &o);
			} else if (d->wait_peer && peer_armed(d)) {
				send_my_ctrl(s, d);
				if (d->ctrl_pending)
					on_ctrl(s, d, &o);
			}
		}
		if (d->send_state == SHIFT_SEND_UNPROTECTED)
			return;
	}
	/* My backup failed and the peer started no new failover: it may be
	 * waiting for one of mine just as well (a failure only one end saw
	 * the cause of: rxe's stale read state after a lost first packet, a
	 * backup link flap). It starts one after a grace, the other end
	 * follows its record (two ends that both start one meet in it, as
	 * when both see the default path fail); a few times in a row at most
	 * without a backup completion in between, then the limit below ends
	 * it. */
	/* my backup failed: the peer reads it in my record (the prober
	 * decides; it may not have seen its own backup fail) */
	if (d->bk_error && !d->bkfail_published)
		ep_publish(s, d);
	/* the peer's backup failed in my episode: my record shows I am in it
	 * (the peer does not go on before it knows, see unjoined()) */
	if (d->peer_bkfail && d->peer_started == d->failovers && d->published_ep != d->failovers)
		ep_publish(s, d);
	if (unjoined(d) && d->poked_ep != d->failovers)
		poke_peer(s, d);
	/* either end's backup failed in this episode and my default path
	 * answered since it started: both back to the default QPs */
	if ((d->bk_error || (d->peer_bkfail && d->peer_started == d->failovers)) &&
	    d->dflt == SHIFT_DFLT_OK && d->need_rearm && !d->ret_wait &&
	    d->peer_started <= d->failovers) {
		struct out o = { .wc = NULL, .n = 0, .max = 0, .c = d->scq };

		if (!d->bk_error)
			shift_info("%s QP %u: the peer's backup path failed", d->dev, d->qpn);
		ret_start(s, d, &o);
		if (d->send_state == SHIFT_SEND_UNPROTECTED)
			return;
	}
	/* (never onto a backup whose port is down: its reset would fail) */
	uint64_t grace = shift_config.bk_restart_ms;
	/* With the default port up, the default path may be back: the prober
	 * waits for its probe (answered: back to the default QP, ret_start;
	 * failed: a new failover), the other end gives it the time to decide
	 * (its return record comes first) */
	bool maybe_back = d->dflt != SHIFT_DFLT_OK && shift_config.probe_ms && port_active(s, d);
	if (maybe_back && (prober(d) ? d->probe_fails == d->bk_probe_fails : true))
		grace = prober(d) ? UINT64_MAX / 2 : 4 * grace;
	if (d->bk_error && d->bk_restarts < SHIFT_BK_RESTARTS && now > d->bk_error_at &&
	    now - d->bk_error_at >= grace && d->peer_started <= d->failovers && !unjoined(d) &&
	    bk_port_active(s, d)) {
		struct out o = { .wc = NULL, .n = 0, .max = 0, .c = d->scq };

		d->bk_restarts++;
		shift_info("%s QP %u: backup QP failed and the peer started no new failover: starting "
			   "failover %lu (restart %u)", d->dev, d->qpn, d->failovers + 1, d->bk_restarts);
		start(s, d, &o, NULL);
		if (d->send_state == SHIFT_SEND_UNPROTECTED)
			return;
	}
	uint64_t limit = shift_config.episode_wait_ms;
	/* (the marks may be set by an application thread after this pass
	 * read the clock: later than now) */
	if ((d->bk_error && now > d->bk_error_at && now - d->bk_error_at >= limit) ||
	    ((d->wait_reset || d->wait_peer || d->ret_wait) && now > d->wait_since &&
	     now - d->wait_since >= limit)) {
		struct out o = { .wc = NULL, .n = 0, .max = 0, .c = d->scq };
		struct ibv_qp_attr e = { .qp_state = IBV_QPS_ERR };

		shift_warn("%s QP %u: cannot fail over (%s): the error goes to the application", d->dev,
			   d->qpn, d->bk_error ? "the backup path failed and the peer started no new failover"
					       : "the peer did not join the new failover");
		/* the default QP's successes are kept, then every WR still
		 * outstanding (on either QP) is flushed to the application */
		shift_lower->modify_qp(d->bk, &e, IBV_QP_STATE);
		shift_lower->modify_qp(d->qp, &e, IBV_QP_STATE);
		shift_dqp_lock(d);
		shift_dqp_set_send_state(d, SHIFT_SEND_FALLBACK, "new failover");
		shift_dqp_unlock(d);
		drain_default(s, d->scq, NULL);
		if (d->rcq != d->scq)
			drain_default(s, d->rcq, NULL);
		fail_connection(s, d, &o, false, NULL);
		return;
	}
	/* Keep the default QP reset (receptive to the peer's probe) whenever
	 * its port is up; probe from it at the probe period, backing off. */
	/* (also while a handshake cannot finish because a backup failed: the
	 * default path may be the way back, ret_start) */
	if (d->send_state == SHIFT_SEND_FALLBACK &&
	    (d->handshake_done || d->bk_error || (d->peer_bkfail && d->peer_started == d->failovers)) &&
	    shift_config.probe_ms) {
		if (d->dflt == SHIFT_DFLT_ERR && port_active(s, d)) {
			int rc = reset_default(s, d);

			shift_debug("%s QP %u: default QP reset: %d", d->dev, d->qpn, rc);
			if (rc == 1) {
				/* receive-only: nothing to probe or send; receptive again */
				d->dflt = SHIFT_DFLT_OK;
				shift_dqp_lock(d);
				shift_dqp_sync_locked(d);
				if (d->sq_tail == d->sq_head) {
					shift_dqp_set_send_state(d, SHIFT_SEND_DEFAULT, "receive-only QP back on the default QP");
					d->failbacks++;
				}
				shift_dqp_unlock(d);
				shift_info("%s QP %u: default QP reset to RTR (the application never sends on it)",
					   d->dev, d->qpn);
			} else if (rc == 0) {
				d->dflt = SHIFT_DFLT_READY;
			} else {
				d->probe_fails++;
				d->probe_at = now + probe_wait(d);
			}
		}
		if (d->dflt == SHIFT_DFLT_READY && now >= d->probe_at && prober(d) && !unjoined(d)) {
			shift_dqp_lock(d);
			int rc = post_probe(d);
			shift_dqp_unlock(d);
			d->dflt = rc ? SHIFT_DFLT_ERR : SHIFT_DFLT_PROBING;
			if (rc)
				d->probe_at = now + probe_wait(d);
		}
	}
	/* (after a return episode the peer's marker is still to consume my
	 * control receive: its completion must not reach the fast path) */
	/* (and only with the backup's port up: a backup NIC that is down now
	 * protects the QP again once it is back) */
	if (d->need_rearm && d->send_state == SHIFT_SEND_DEFAULT &&
	    d->recv_state == SHIFT_RECV_DEFAULT && !d->notify_inflight &&
	    !(d->ctrl_recv_out && !d->peer_nosend) && bk_port_active(s, d) &&
	    rearm_backup(s, d) == 0)
		shift_info("%s QP %u: back on the default QP in both directions, backup QP %u re-armed "
			   "(failovers %lu, failbacks %lu)", d->dev, d->qpn, d->bk->qp_num, d->failovers,
			   d->failbacks);
}

/* ---- polling ---------------------------------------------------------------- */

/* A completion from a default CQ, in the slow path. */
static void from_default(struct shift_ctx *s, struct ibv_wc *wc, struct out *o)
{
	struct shift_dqp *d = shift_dqp_by_qpn(s, wc->qp_num);

	if (d && d->failovers && (wc->wr_id & ~0xfull) == (SHIFT_WRID_CTRL_RECV & ~0xfull) &&
	    (wc->wr_id & 0xf) - 1 < 5) {
		/* SHIFT's own (probe, notification) never reach the application */
		if (d->send_state != SHIFT_SEND_UNPROTECTED)
			on_default_ctrl(s, d, wc, o);
		return;
	}
	if (!d || d->send_state == SHIFT_SEND_UNPROTECTED) {
		emit(o, wc);
		return;
	}
	if (wc->status == IBV_WC_SUCCESS) {
		shift_dqp_retire(d, wc);
		emit(o, wc);
		return;
	}
	/* a flush of a QP already on its backup; unless a direction came
	 * back to the default QP (my receives) and it failed again */
	if (d->send_state != SHIFT_SEND_DEFAULT &&
	    !(d->need_rearm && d->recv_state == SHIFT_RECV_DEFAULT))
		return;
	shift_debug("%s QP %u: error completion %d (opcode %d, wr %#llx) starts a failover", d->dev,
		    d->qpn, (int)wc->status, (int)wc->opcode, (unsigned long long)wc->wr_id);
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
		d->peer_nosend = !!(d->peer_recv_count & CTRL_NOSEND);
		d->peer_recv_count &= ~CTRL_NOSEND;
		d->ctrl_pending = true;
		shift_ctx_set_slow(s, true);
		if (app || d->send_state == SHIFT_SEND_UNPROTECTED)
			on_ctrl(s, d, o); /* the latter only answers ABORT */
		return;
	}
	if (wc->wr_id == SHIFT_WRID_CTRL_SEND || !d) {
		if (d && wc->wr_id == SHIFT_WRID_CTRL_SEND && wc->status == IBV_WC_SUCCESS)
			d->bk_rd_stale = false; /* its empty READ, if any, went first */
		if (wc->status != IBV_WC_SUCCESS)
			shift_debug("backup QP %u: SHIFT's WR %llx failed: %d", wc->qp_num,
				    (unsigned long long)wc->wr_id, (int)wc->status);
		/* my handshake message failed: the backup failed as surely as
		 * with a WR of the application on it (which there may be none
		 * of: an end that only sends, before the handshake) */
		if (!d || wc->status == IBV_WC_SUCCESS || d->bk_flushing || d->bk_error ||
		    d->send_state == SHIFT_SEND_UNPROTECTED || !d->need_rearm)
			return;
	} else if (!(wc->wr_id & SHIFT_WRID_DATA)) {
		return;
	}
	if (wc->status != IBV_WC_SUCCESS && d->send_state != SHIFT_SEND_UNPROTECTED) {
		/* flushes of a reset, late ones of an earlier generation, and
		 * what follows a failure already seen are SHIFT's */
		if (d->bk_flushing || d->bk_error ||
		    (wc->wr_id != SHIFT_WRID_CTRL_SEND && SHIFT_WRID_GEN_OF(wc->wr_id) != d->bk_gen))
			return;
		/* The backup failed: the peer may have reset its own for a new
		 * failover (its default path failed again), which its record
		 * in the KV store shows; failback_work() decides. The WR stays
		 * outstanding. */
		shift_info("%s QP %u: backup QP %u failed (%d): checking for a new failover at the peer",
			   d->dev, d->qpn, wc->qp_num, (int)wc->status);
		if (!d->bk_error)
			d->bk_probe_fails = d->probe_fails;
		d->bk_error = true;
		d->bk_error_at = fb_now();
		d->kv_at = 0;
		return;
	}
	uint64_t idx = SHIFT_WRID_INDEX(wc->wr_id);
	if (wc->wr_id & SHIFT_WRID_RECV) {
		wc->wr_id = shift_dqp_rwqe(d, idx)->wr_id;
	} else {
		struct shift_swqe *e = shift_dqp_swqe(d, idx);

		wc->wr_id = e->wr_id;
		/* (a placeholder's completion is its WR's) */
		if (wc->status == IBV_WC_SUCCESS)
			wc->opcode = send_wc_opcode(e->opcode);
	}
	wc->qp_num = d->qpn;
	if (wc->status == IBV_WC_SUCCESS) {
		shift_dqp_retire(d, wc);
		d->bk_restarts = 0; /* the backup path works */
		if (!d->fallback_us && d->t_error_us) {
			d->fallback_us = mono_us() - d->t_error_us;
			if (!d->fallback_us)
				d->fallback_us = 1;
			shift_info("%s QP %u: failover-timing dev=%s qp=%u switch_us=%llu fallback_us=%llu",
				   d->dev, d->qpn, d->dev, d->qpn, (unsigned long long)d->switch_us,
				   (unsigned long long)d->fallback_us);
		}
	}
	emit(o, wc);
	if (d->send_state == SHIFT_SEND_WAIT_DRAINED) {
		shift_dqp_lock(d);
		shift_dqp_sync_locked(d);
		/* the fence completed: everything before it has executed */
		if (d->send_state == SHIFT_SEND_WAIT_DRAINED && !d->notify_inflight &&
		    d->sq_tail > d->fence)
			switch_back(d);
		shift_dqp_unlock(d);
	}
	if (d->notify_pending)
		try_notify(d);
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
	pthread_mutex_lock(&s->slow_lock);
	pthread_mutex_lock(&c->dp_lock);
	/* completions the fast path already took from the provider */
	if (have > done) {
		int m = have - done;
		struct ibv_wc *src = m <= TMP_WC ? tmp : malloc(sizeof(*wc) * (size_t)m);

		if (!src) {
			pthread_mutex_unlock(&c->dp_lock);
			pthread_mutex_unlock(&s->slow_lock);
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
	pthread_mutex_unlock(&s->slow_lock);
	return o.n;
}

/* A QP's send and receive CQs' dp_locks, in address order. */
static void lock_cqs(struct shift_dqp *d)
{
	struct shift_cq *c2 = d->rcq && d->rcq != d->scq ? d->rcq : NULL;

	if (c2 && c2 < d->scq)
		pthread_mutex_lock(&c2->dp_lock);
	pthread_mutex_lock(&d->scq->dp_lock);
	if (c2 && c2 > d->scq)
		pthread_mutex_lock(&c2->dp_lock);
}

static void unlock_cqs(struct shift_dqp *d)
{
	if (d->rcq && d->rcq != d->scq)
		pthread_mutex_unlock(&d->rcq->dp_lock);
	pthread_mutex_unlock(&d->scq->dp_lock);
}

/* ---- the port watch ----------------------------------------------------------
 *
 * An error completion is the usual trigger of a failover. A port that stops
 * being ACTIVE is another, and sometimes the only one: soft-RoCE retries
 * for ever on a cut link and never completes a WR in error, and hardware
 * reports the failure only once its retry budget is spent. When the default
 * port of protected QPs has not been ACTIVE for SHIFT_PORT_DOWN_MS, they
 * fail over as if an error had been polled: start() flushes the default QP
 * and keeps its successful completions for the application. The context
 * goes to the slow path as soon as the port is seen down, so by then no
 * poll of the application is inside the fast path.
 */
static void watch_ports(struct shift_ctx *s, uint64_t now_ms)
{
	int st[SHIFT_WATCH_PORTS + 1] = { 0 }; /* 0 not asked, 1 active, 2 down */
	uint64_t t = now_ms + 1;
	uint64_t limit = shift_config.port_down_ms;
	bool down = false;

	if (!limit) {
		s->ports_down = false;
		return;
	}
	if (limit < shift_config.bg_grace_ms)
		limit = shift_config.bg_grace_ms;
	for (int i = 0; i < SHIFT_DQP_BUCKETS; i++) {
		for (struct shift_dqp *d = __atomic_load_n(&s->dqp[i], __ATOMIC_ACQUIRE); d;
		     d = d->next_in_bucket) {
			if (d->send_state != SHIFT_SEND_DEFAULT || !d->scq || !d->rcq ||
			    !d->shadow ||
			    __atomic_load_n(&d->shadow->state, __ATOMIC_ACQUIRE) != SHIFT_SHADOW_READY)
				continue;
			pthread_mutex_lock(&s->rnic->lock);
			unsigned port = d->shadow->attr.port_num;
			bool connected = (d->shadow->attr_mask & IBV_QP_AV) != 0;
			pthread_mutex_unlock(&s->rnic->lock);
			if (!connected)
				continue;
			if (port < 1 || port > SHIFT_WATCH_PORTS)
				port = 1;
			if (!st[port]) {
				/* a port that cannot be queried counts as up */
				st[port] = port_state(s, port) ? 1 : 2;
				if (st[port] == 1) {
					s->port_down_since[port] = 0;
				} else if (!s->port_down_since[port]) {
					s->port_down_since[port] = t;
					shift_info("%s: port %u is down: its QPs fail over in %llu %s unless it "
						   "comes back", d->dev, port, (unsigned long long)limit,
						   "ms");
				}
			}
			if (st[port] == 1)
				continue;
			down = true;
			shift_ctx_set_slow(s, true);
			if (t - s->port_down_since[port] < limit)
				continue;
			lock_cqs(d);
			if (d->send_state == SHIFT_SEND_DEFAULT) {
				struct out o = { .wc = NULL, .n = 0, .max = 0, .c = d->scq };

				shift_info("%s QP %u: port %u down for %llu %s: failing over without an "
					   "error completion", d->dev, d->qpn, port,
					   (unsigned long long)(t - s->port_down_since[port]),
					   "ms");
				if (start(s, d, &o, NULL) && d->send_state == SHIFT_SEND_UNPROTECTED) {
					/* given up: the application sees its QP fail, as
					 * the provider would have shown it sooner or later */
					struct ibv_qp_attr e = { .qp_state = IBV_QPS_ERR };

					shift_lower->modify_qp(d->qp, &e, IBV_QP_STATE);
				}
			}
			unlock_cqs(d);
		}
	}
	s->ports_down = down;
}

/* Held by a whole background pass and by shift_failover_forget(): a pass
 * never walks a QP state that destroy_qp is about to free. */
static pthread_mutex_t bg_lock = PTHREAD_MUTEX_INITIALIZER;

struct shift_dqp *shift_failover_forget(struct shift_ctx *s, struct ibv_qp *qp)
{
	pthread_mutex_lock(&bg_lock);
	struct shift_dqp *d = shift_ctx_remove_dqp(s, qp);

	if (d)
		fo_remove(s, d);
	pthread_mutex_unlock(&bg_lock);
	return d;
}

static void background(struct shift_ctx *s);
static bool waiting_seen;

bool shift_failover_waiting(void)
{
	bool w = __atomic_exchange_n(&waiting_seen, false, __ATOMIC_ACQ_REL);

	return w;
}

void shift_failover_background(struct shift_ctx *s)
{
	if (!s->rnic)
		return;
	pthread_mutex_lock(&bg_lock);
	pthread_mutex_lock(&s->slow_lock);
	background(s);
	pthread_mutex_unlock(&s->slow_lock);
	pthread_mutex_unlock(&bg_lock);
}

/* Has the grace passed since `since` (ms) that lets a poll which entered
 * the fast path before its context went slow finish? (Synchronous replay
 * has no such poll.) */
static bool grace_passed(uint64_t since, uint64_t now)
{
	return now - since >= shift_config.bg_grace_ms;
}

/* A peer's handshake message the background thread noticed, for a passive
 * application: answered here once the grace has passed (see background()). */
static void answer_peer(struct shift_ctx *s, struct shift_dqp *d, uint64_t now)
{
	if (!d->ctrl_pending)
		return;
	if (!d->ctrl_seen_ms)
		d->ctrl_seen_ms = now;
	if (!grace_passed(d->ctrl_seen_ms, now))
		return;
	lock_cqs(d);
	if (d->ctrl_pending) {
		struct out o = { .wc = NULL, .n = 0, .max = 0, .c = d->rcq ? d->rcq : d->scq };
		on_ctrl(s, d, &o);
	}
	unlock_cqs(d);
}

/* A QP whose provider refused a post because it failed, with no error
 * completion to start its failover (shift_failover_post_refused()). */
static void fail_over_refused(struct shift_ctx *s, struct shift_dqp *d, uint64_t now)
{
	if (!__atomic_load_n(&d->post_failed, __ATOMIC_ACQUIRE))
		return;
	/* (as for a port that went down: a poll that entered the fast path
	 * before the context went slow finishes first) */
	if (!grace_passed(d->post_failed_ms, now))
		return;
	lock_cqs(d);
	if (d->post_failed && (d->send_state == SHIFT_SEND_DEFAULT || d->need_rearm)) {
		struct out o = { .wc = NULL, .n = 0, .max = 0, .c = d->scq };

		shift_info("%s QP %u: failing over on a refused post", d->dev, d->qpn);
		start(s, d, &o, NULL);
	}
	d->post_failed = false; /* (a failover holds its WRs now) */
	unlock_cqs(d);
}

/*
 * The peers' records of the Default-state QPs ds[0..n), in one KV read
 * (every QP on a poked GID reads its record): those whose peer started a
 * failover they never saw follow it at a later pass (join_peer()), once a
 * poll already inside the fast path has finished; polls go to the slow
 * path from now.
 */
static void poke_check(struct shift_ctx *s, struct shift_dqp **ds, size_t n, uint64_t now)
{
	bool got[SHIFT_KV_MGET_MAX];

	if (ep_mget(s, ds, n, got))
		return;
	for (size_t k = 0; k < n; k++) {
		if (!got[k] || ds[k]->peer_started <= ds[k]->failovers)
			continue;
		ds[k]->peer_join_ms = now;
		__atomic_store_n(&ds[k]->peer_join, true, __ATOMIC_RELEASE);
		shift_ctx_set_slow(s, true);
	}
}

/* The context's poke slot of a default GID, or -1. */
static int poke_slot(const struct shift_ctx *s, const union ibv_gid *gid)
{
	for (int k = 0; k < s->npoke; k++)
		if (!memcmp(&s->poke[k].gid, gid, sizeof(*gid)))
			return k;
	return -1;
}

/*
 * The poke read (see unjoined()): the values under the poke keys of the
 * context's default GIDs; a changed one (or the first read) has the
 * Default-state QPs on that GID read their peers' records, and those whose
 * peer started a failover they never saw follow it (join_peer()).
 */
static void poke_read(struct shift_ctx *s, uint64_t now)
{
	struct shift_rnic *r = s->rnic;
	char keys[SHIFT_POKE_GIDS][SHIFT_EXCHANGE_KEY_MAX];
	const char *kp[SHIFT_POKE_GIDS];
	void *v[SHIFT_POKE_GIDS];
	size_t len[SHIFT_POKE_GIDS];
	bool changed[SHIFT_POKE_GIDS] = { false };
	bool any = false;

	if (!r || !r->kv || !shift_config.poke_ms || now < s->poke_at)
		return;
	s->poke_at = now + shift_config.poke_ms;
	/* the GIDs: those of the protected QPs (few per context) */
	for (int i = 0; i < SHIFT_DQP_BUCKETS; i++) {
		for (struct shift_dqp *d = __atomic_load_n(&s->dqp[i], __ATOMIC_ACQUIRE); d;
		     d = d->next_in_bucket) {
			if (!d->scq || !d->shadow || poke_slot(s, &d->shadow->my_key.gid) >= 0 ||
			    s->npoke == SHIFT_POKE_GIDS)
				continue;
			s->poke[s->npoke].gid = d->shadow->my_key.gid;
			s->poke[s->npoke++].read = false;
		}
	}
	if (!s->npoke)
		return;
	for (int k = 0; k < s->npoke; k++) {
		if (shift_exchange_poke_key(&s->poke[k].gid, keys[k], sizeof(keys[k])) < 0)
			return;
		kp[k] = keys[k];
	}
	if (shift_kv_mget(r->kv, kp, (size_t)s->npoke, v, len))
		return;
	for (int k = 0; k < s->npoke; k++) {
		char now_seen[sizeof(s->poke[k].seen)] = "";

		if (v[k])
			snprintf(now_seen, sizeof(now_seen), "%.*s", (int)len[k], (char *)v[k]);
		free(v[k]);
		if (s->poke[k].read && !strcmp(now_seen, s->poke[k].seen))
			continue;
		/* (a first read looks too: a poke may predate this process's
		 * first look, never one before its QPs existed) */
		changed[k] = v[k] != NULL || s->poke[k].read;
		any |= changed[k];
		s->poke[k].read = true;
		memcpy(s->poke[k].seen, now_seen, sizeof(now_seen));
	}
	if (!any)
		return;
	struct shift_dqp *ds[SHIFT_KV_MGET_MAX];
	size_t n = 0;

	for (int i = 0; i < SHIFT_DQP_BUCKETS; i++) {
		for (struct shift_dqp *d = __atomic_load_n(&s->dqp[i], __ATOMIC_ACQUIRE); d;
		     d = d->next_in_bucket) {
			int k;

			if (!d->scq || !d->shadow || d->send_state != SHIFT_SEND_DEFAULT ||
			    d->recv_state != SHIFT_RECV_DEFAULT || d->need_rearm || d->peer_join)
				continue;
			k = poke_slot(s, &d->shadow->my_key.gid);
			if (k < 0 || !changed[k])
				continue;
			ds[n++] = d;
			if (n == SHIFT_KV_MGET_MAX) {
				poke_check(s, ds, n, now);
				n = 0;
			}
		}
	}
	if (n)
		poke_check(s, ds, n, now);
}

/* A Default-state QP whose peer started failover peer_started without it
 * (poke_read()): it follows that failover. */
static void join_peer(struct shift_ctx *s, struct shift_dqp *d, uint64_t now)
{
	if (!__atomic_load_n(&d->peer_join, __ATOMIC_ACQUIRE))
		return;
	if (!grace_passed(d->peer_join_ms, now))
		return;
	lock_cqs(d);
	if (d->peer_join && d->send_state == SHIFT_SEND_DEFAULT && !d->need_rearm &&
	    d->peer_started > d->failovers) {
		struct out o = { .wc = NULL, .n = 0, .max = 0, .c = d->scq };

		shift_info("%s QP %u: the peer started failover %u, which never reached me (its "
			   "backup path failed): following it", d->dev, d->qpn, d->peer_started);
		d->failovers = d->peer_started - 1; /* (start() counts it) */
		if (start(s, d, &o, NULL) == 0 && d->send_state != SHIFT_SEND_UNPROTECTED &&
		    d->published_ep != d->failovers)
			ep_publish(s, d);
	}
	d->peer_join = false;
	unlock_cqs(d);
}

static void background(struct shift_ctx *s)
{
	struct shift_rnic *r = s->rnic;

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
	uint64_t now = fb_now();
	watch_ports(s, now);
	poke_read(s, now);
	for (int i = 0; i < SHIFT_DQP_BUCKETS; i++) {
		for (struct shift_dqp *d = __atomic_load_n(&s->dqp[i], __ATOMIC_ACQUIRE); d;
		     d = d->next_in_bucket) {
			if (!d->scq)
				continue;
			answer_peer(s, d, now);
			fail_over_refused(s, d, now);
			join_peer(s, d, now);
		}
	}

	/* failback: probes, switching back, re-arming the backup */
	shift_clock_tick();
	uint64_t fbt = fb_now();
	int nfo = __atomic_load_n(&s->nfo, __ATOMIC_ACQUIRE);
	ep_prefetch(s, nfo, fbt);
	for (int i = 0; i < nfo; i++) {
		struct shift_dqp *d = __atomic_load_n(&s->fo[i], __ATOMIC_ACQUIRE);

		if (!d || !d->scq)
			continue;
		/* the application may be inside the fast path of a poll that
		 * started before the context went slow: let it finish */
		uint64_t te = d->t_error_us / 1000u; /* (may be later than now) */
		if (te > now || now - te < shift_config.bg_grace_ms)
			continue;
		lock_cqs(d);
		failback_work(s, d, fbt);
		if (d->wait_reset || d->wait_peer || d->bk_error || d->ret_wait)
			__atomic_store_n(&waiting_seen, true, __ATOMIC_RELEASE);
		unlock_cqs(d);
	}
	/* (a batched read the pass did not use is stale by the next one) */
	for (int i = 0; i < nfo; i++) {
		struct shift_dqp *d = __atomic_load_n(&s->fo[i], __ATOMIC_ACQUIRE);

		if (d)
			d->kv_pref = 0;
	}
	/* nothing failed over any more: polls take the fast path again once
	 * every completion SHIFT kept has been handed out */
	if (__atomic_load_n(&s->slow, __ATOMIC_ACQUIRE) && !__atomic_load_n(&s->nfo, __ATOMIC_ACQUIRE)) {
		bool quiet = !s->ports_down;

		for (struct shift_cq *c = head; c && quiet; c = c->next) {
			pthread_mutex_lock(&c->dp_lock);
			quiet = c->kept_head == c->kept_tail;
			pthread_mutex_unlock(&c->dp_lock);
		}
		for (int i = 0; quiet && i < SHIFT_DQP_BUCKETS; i++)
			for (struct shift_dqp *d = __atomic_load_n(&s->dqp[i], __ATOMIC_ACQUIRE); d;
			     d = d->next_in_bucket)
				if (d->ctrl_pending)
					quiet = false;
		if (quiet)
			shift_ctx_set_slow(s, false);
	}
}

/* ---- failed posts ----------------------------------------------------------
 *
 * A provider may refuse WRs on a QP that failed: some refuse every post in
 * ERR, and a device that is gone fails the system call of the doorbell. To
 * the application that is the same failure as an error completion, and
 * SHIFT hides it the same way: the refused WRs stay in the mirror behind
 * those the provider took (and flushes), the post succeeds, and the QP
 * fails over, in the application's next poll if an error completion comes
 * first, else in the next background pass (after the grace that lets a poll
 * inside the fast path finish, as for a port gone down). The QP's own state
 * tells the two apart: a refusal while the QP is not in ERR (a bad WR, a
 * full queue) is the application's, as without SHIFT, and so is every
 * refusal on a QP SHIFT could not fail over anyway. If the failover cannot
 * start after all, the taken WRs complete with a flush error.
 */
/* The default QP refused WRs (post_lock held): has it failed? Then the
 * WRs from sq_from and rq_from on are SHIFT's (see above). */
static bool take_refused(struct shift_dqp *d, int rc, uint64_t sq_from, uint64_t rq_from)
{
	struct ibv_qp_attr attr;
	struct ibv_qp_init_attr init;
	struct shift_ctx *s = shift_ctx_of(d->qp->context);
	int q;

	if (!s || !s->rnic || !d->shadow || !d->scq || !d->rcq ||
	    __atomic_load_n(&d->shadow->state, __ATOMIC_ACQUIRE) != SHIFT_SHADOW_READY)
		return false;
	memset(&attr, 0, sizeof(attr));
	q = shift_lower->query_qp(d->qp, &attr, IBV_QP_STATE, &init);
	if (!q && attr.qp_state != IBV_QPS_ERR && attr.qp_state != IBV_QPS_SQE)
		return false;
	if (!d->post_failed) {
		d->sq_taken = sq_from;
		d->rq_taken = rq_from;
		d->post_failed_ms = mono_us() / 1000u;
		shift_info("%s QP %u: the provider refused a post (%s) on a failed QP (%s): "
			   "SHIFT keeps the WRs for its backup QP", d->dev, d->qpn, strerror(rc),
			   q ? "cannot query it" : "ERR");
		__atomic_store_n(&d->post_failed, true, __ATOMIC_RELEASE);
	}
	shift_ctx_set_slow(s, true);
	return true;
}

bool shift_failover_post_refused(struct shift_dqp *d, int rc, uint64_t sq_from, uint64_t rq_from)
{
	return d->send_state == SHIFT_SEND_DEFAULT && take_refused(d, rc, sq_from, rq_from);
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
	if (!d->handshake_done || d->send_state == SHIFT_SEND_WAIT_DRAINED)
		return 0; /* held: retransmit() or switch_back() posts them */
	for (uint64_t i = head; i < d->sq_head; i++) {
		struct shift_swqe *e = shift_dqp_swqe(d, i);
		bool fence = d->send_state == SHIFT_SEND_WAIT_SIGNALED &&
			     ((e->send_flags & IBV_SEND_SIGNALED) || d->sq_sig_all);

		/* the fence: set before it can complete; what follows it is held */
		if (fence) {
			d->fence = i;
			shift_dqp_set_send_state(d, SHIFT_SEND_WAIT_DRAINED, "fence posted");
		}
		if (post_bk_send(d, i)) {
			if (fence)
				shift_dqp_set_send_state(d, SHIFT_SEND_WAIT_SIGNALED, "the fence could not be posted");
			/* report the first WR that did not go out */
			struct ibv_send_wr *w = wr;

			for (uint64_t k = head; k < i; k++)
				w = w->next;
			shift_dqp_unrecord_send(d, wr, w, head);
			*bad_wr = w;
			return EIO;
		}
		if (fence)
			break;
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
	if (d->notify_pending || d->recv_hold)
		return 0; /* try_notify() or start() posts them */
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
