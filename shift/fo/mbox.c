/*
 * The key mailbox (shadow/mbox.h): a failed-over connection asks the peer
 * itself, over the backup path, for the backup key of an MR the KV store
 * cannot give (memory the peer registered while the store was gone is in
 * no record, nor in its MR index).
 *
 * On the background thread, in the pass's KV share (fo_kvq_run), for each
 * failed-over QP whose two ends published a mailbox, once the handshake is
 * done (the peer's backup QP is connected and it is failed over too):
 * - a key the store could not give (fo/kvq.c marks it `ask`) is asked with
 *   an RDMA WRITE of {nonce, rkey, check} into the peer's slot; one request
 *   in flight per QP;
 * - the peer's request in my slot is answered with an RDMA WRITE of {its
 *   nonce, the rkey, my backup key and the MR's range, or ABSENT} into its
 *   slot: the record I would have published;
 * - the answer in my slot is taken if its check holds and it echoes my
 *   request's nonce: the key is known, or absent (a WR outstanding at the
 *   failure ends the connection with the path's error; one posted while
 *   failed over is refused as the peer's NIC would refuse it: fo/common.c,
 *   post_built).
 * A WRITE consumes no receive, so the application's receives keep their
 * order. The answer comes over the connection of the QP's own peer, and
 * only that peer saw the nonce (my slot grants remote writes only): a
 * third party writing into the page cannot steer a WR. What the mailbox
 * cannot settle still fails after SHIFT_KV_WAIT_MS (fo_rk_lookup): never a
 * wait without bound. The peer's answer comes at its next pass: passes
 * come every SHIFT_MBOX_POLL_MS while a failed-over QP has a mailbox.
 */
#include "shift/fo/fo_int.h"
#include "shift/shadow/mbox.h"

#include <stddef.h>
#include <sys/random.h>

#define SHIFT_MBOX_POLL_MS 20
#define SHIFT_MBOX_RETRY_MS 500 /* a request unanswered this long is sent again */

/* The peer told its backup key for app over the key mailbox (fo/mbox.c),
 * or that it has no such MR (!known): the key is known or absent now, if
 * it is still wanted. Background. */
void fo_rk_told(struct shift_dqp *d, uint32_t app, bool known, const struct shift_rkey_val *v,
		uint64_t now)
{
	pthread_mutex_lock(&d->rk_lock);
	struct shift_rkey *e = fo_rk_find(d, app);

	if (e && e->st == SHIFT_RK_WANT && !e->ahead) {
		e->ask = false;
		if (known) {
			fo_rk_known(e, *v, now);
		} else {
			e->st = SHIFT_RK_ABSENT;
			e->at_ms = now;
		}
	}
	pthread_mutex_unlock(&d->rk_lock);
}

/* A key to ask the peer for over the key mailbox: prefer if still wanted,
 * else the first wanted one the store could not give. Background. */
bool fo_rk_to_ask(struct shift_dqp *d, uint32_t prefer, uint32_t *app)
{
	bool found = false;

	pthread_mutex_lock(&d->rk_lock);
	for (unsigned i = 0; i < d->rk_n; i++) {
		const struct shift_rkey *e = &d->rk[i];

		if (e->st != SHIFT_RK_WANT || e->ahead || !e->ask)
			continue;
		if (!found || e->app == prefer)
			*app = e->app;
		found = true;
		if (e->app == prefer)
			break;
	}
	pthread_mutex_unlock(&d->rk_lock);
	return found;
}

/* d's backup QP is reset: a mailbox WRITE in flight on it, my request or
 * my answer, may be lost (flushed), and so may the peer's, as its end is
 * reset too. My request is asked again, with a new nonce, as soon as the
 * QP can post (an answer to the old one is ignored), and the peer's request
 * in my slot is answered again: a key never waits out the retry period
 * behind a reset. slow_lock held (fo_reset_backup()), as for the pass's
 * mailbox work. */
void fo_mbox_reset(struct shift_dqp *d)
{
	struct shift_qp *q = d->shadow;

	if (!q)
		return;
	q->mb_nonce = 0;
	q->mb_answered = 0;
}

/* Can d use its mailbox (both ends have one)? */
bool fo_mbox_possible(const struct shift_dqp *d)
{
	const struct shift_qp *q = d->shadow;

	return q && q->mb && q->peer_bk.has_mb && (q->bk_access & IBV_ACCESS_REMOTE_WRITE);
}

/* ... and post on its backup QP now (the episode's, not reset since its
 * handshake)? Then it answers the peer's requests: the peer's sends may
 * still be on the backup path after mine came back (its WR to my memory
 * waits for my key; before, such a request went unanswered and the WR
 * failed after SHIFT_KV_WAIT_MS: the testbed's kv_killed_latemr_write). */
static bool can_answer(const struct shift_dqp *d)
{
	return fo_mbox_possible(d) && d->bk && d->handshake_done && !d->bk_error &&
	       !d->bk_flushing;
}

/* ... and ask: its own sends are on the backup path, failing back
 * included (a WR held for its key is the backup's until it drains, and
 * its key may come as the default path answers the probe again). */
static bool can_ask(const struct shift_dqp *d)
{
	enum shift_send_state st = shift_dqp_send_state(d);

	return can_answer(d) && (st == SHIFT_SEND_FALLBACK || st == SHIFT_SEND_WAIT_SIGNALED ||
				 st == SHIFT_SEND_WAIT_DRAINED);
}

/* RDMA WRITE len bytes of my slot's staging at src into the peer's slot at
 * offset off (SHIFT's own WR: its completion is dropped, a failure is the
 * backup path's). */
static int write_peer(struct shift_dqp *d, const void *src, uint32_t len, size_t off)
{
	const struct shift_qp *q = d->shadow;
	struct ibv_sge sge = { .addr = (uintptr_t)src, .length = len, .lkey = q->mb_lkey };
	struct ibv_send_wr wr = {
		.wr_id = SHIFT_WRID_CTRL_SEND, .sg_list = &sge, .num_sge = 1,
		.opcode = IBV_WR_RDMA_WRITE, .send_flags = IBV_SEND_SIGNALED,
		.wr.rdma = { .remote_addr = q->peer_bk.mb_addr + off, .rkey = q->peer_bk.mb_rkey },
	}, *bad;

	shift_dqp_lock(d);
	int rc = ibv_post_send(d->bk, &wr, &bad);
	shift_dqp_unlock(d);
	if (rc)
		shift_debug("%s QP %u: key mailbox: post failed: %s", d->dev, d->qpn, strerror(rc));
	return rc;
}

static uint64_t nonce(void)
{
	static uint64_t n;
	uint64_t v = 0;

	if (getrandom(&v, sizeof(v), GRND_NONBLOCK) != (ssize_t)sizeof(v))
		v = (shift_clock_us() ^ __atomic_add_fetch(&n, 1, __ATOMIC_RELAXED) *
					 0x9e3779b97f4a7c15ull) * 0xbf58476d1ce4e5b9ull;
	return v ? v : 1;
}

/* The peer's request in my slot, if new: answered. */
static void answer(struct shift_ctx *s, struct shift_dqp *d)
{
	struct shift_qp *q = d->shadow;
	struct shift_mbox_slot *mb = q->mb;
	struct shift_mbox_req rq;
	struct shift_mr_value mv;

	shift_mbox_read_req(&mb->req, &rq);
	if (!rq.nonce || rq.nonce == q->mb_answered || rq.check != shift_mbox_req_check(&rq))
		return;
	int own = shift_shadow_own_mr(s->rnic, q, rq.rkey, &mv);
	bool known = own > 0;
	struct shift_mbox_ans *a = &mb->out_ans;

	if (own < 0)
		return; /* (its backup not registered yet: answered at a later pass) */
	memset(a, 0, sizeof(*a));
	a->nonce = rq.nonce;
	a->rkey = rq.rkey;
	a->flags = !known ? SHIFT_MBOX_ABSENT :
		   SHIFT_MBOX_KNOWN | (mv.has_range ? SHIFT_MBOX_RANGED : 0);
	if (known) {
		a->bk = mv.bk_rkey;
		a->addr = mv.addr;
		a->len = mv.len;
	}
	a->check = shift_mbox_ans_check(a);
	if (write_peer(d, a, sizeof(*a), offsetof(struct shift_mbox_slot, ans)))
		return; /* (again at the next pass) */
	q->mb_answered = rq.nonce;
	__atomic_fetch_add(&shift_stats.mbox_answered, 1, __ATOMIC_RELAXED);
	shift_info("%s QP %u: key mailbox: the peer asked for rkey %u: %s", d->dev, d->qpn,
		   rq.rkey, known ? "its backup key sent" : "no such MR here, said so");
}

/* My request's answer in my slot, if there: the key known or absent. */
static void take(struct shift_dqp *d, uint64_t now)
{
	struct shift_qp *q = d->shadow;
	struct shift_mbox_ans an;

	shift_mbox_read_ans(&q->mb->ans, &an);
	if (an.nonce != q->mb_nonce || an.rkey != q->mb_rkey ||
	    an.check != shift_mbox_ans_check(&an))
		return;
	bool known = an.flags == SHIFT_MBOX_KNOWN || an.flags == (SHIFT_MBOX_KNOWN | SHIFT_MBOX_RANGED);
	bool ranged = an.flags & SHIFT_MBOX_RANGED;

	if ((!known && an.flags != SHIFT_MBOX_ABSENT) ||
	    (ranged && an.len > UINT64_MAX - an.addr)) {
		shift_warn("%s QP %u: key mailbox: the peer's answer for rkey %u is malformed: "
			   "ignored", d->dev, d->qpn, an.rkey);
		q->mb_nonce = 0;
		return;
	}
	q->mb_nonce = 0;
	fo_rk_told(d, an.rkey, known, &(struct shift_rkey_val){ .bk = an.bk, .ranged = ranged,
							       .addr = an.addr, .len = an.len }, now);
	__atomic_fetch_add(&shift_stats.mbox_taken, 1, __ATOMIC_RELAXED);
	shift_info("%s QP %u: key mailbox: the peer %s rkey %u", d->dev, d->qpn,
		   known ? "sent its backup key for" : "has no MR of", an.rkey);
}

/* A key to ask, if none is in flight (or one went unanswered). */
static void ask(struct shift_dqp *d, uint64_t now)
{
	struct shift_qp *q = d->shadow;
	uint32_t rkey = 0;

	if (q->mb_nonce && now - q->mb_at < SHIFT_MBOX_RETRY_MS)
		return;
	if (!fo_rk_to_ask(d, q->mb_nonce ? q->mb_rkey : 0, &rkey))
		return;
	struct shift_mbox_req *r = &q->mb->out_req;

	r->nonce = nonce();
	r->rkey = rkey;
	r->pad = 0;
	r->check = shift_mbox_req_check(r);
	if (write_peer(d, r, sizeof(*r), offsetof(struct shift_mbox_slot, req)))
		return;
	bool again = q->mb_nonce != 0;

	q->mb_nonce = r->nonce;
	q->mb_rkey = rkey;
	q->mb_at = now;
	__atomic_fetch_add(&shift_stats.mbox_asked, 1, __ATOMIC_RELAXED);
	shift_info("%s QP %u: the KV store cannot give the peer's backup key for rkey %u: %s the "
		   "peer over the backup path", d->dev, d->qpn, rkey, again ? "asking again" : "asking");
}

/* The pass's mailbox work for s's failed-over QPs (slow_lock held). */
void fo_mbox_run(struct shift_ctx *s)
{
	uint64_t now = shift_clock_ms();
	bool any = false;

	for (int i = 0; i < s->nfo; i++) {
		struct shift_dqp *d = s->fo[i];

		if (!d || !d->scq || !can_answer(d))
			continue;
		any = true;
		answer(s, d);
		if (!can_ask(d))
			continue;
		if (d->shadow->mb_nonce)
			take(d, now);
		ask(d, now);
	}
	if (any && s->rnic)
		shift_rnic_due(s->rnic, now + SHIFT_MBOX_POLL_MS);
}
