/*
 * The ibv_qp_ex work-request builders of a protected QP (see qpex.h): the
 * batch and the registry; qpex_build.c has the builders.
 *
 * A batch's mode is fixed at ibv_wr_start, under the QP's post_lock, from
 * the send state: QPX_REC (Default: mirror and forward to the provider's
 * builders), QPX_HOLD (failed over or failing back: build struct
 * ibv_send_wr for the failover layer; the provider sees nothing), QPX_PASS
 * (unprotected: the provider's). Mirror entries are made as the builders
 * are called (sq_head moves under post_lock, which nobody else takes
 * before the batch ends) and taken back if the batch is aborted or refused.
 */
#include "shift/dp/qpex.h"
#include "shift/dp/qpex_int.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>

struct shift_qpx shift_qpx_none; /* (its qx, NULL, is no application's) */
struct shift_qpx *shift_qpx_tab[QPX_TAB] = { [0 ... QPX_TAB - 1] = &shift_qpx_none };
static pthread_mutex_t reg = PTHREAD_MUTEX_INITIALIZER;

struct shift_qpx *qpx_lost(void)
{
	shift_err("ibv_wr_* on a QP SHIFT no longer knows (being destroyed?): ignored");
	return NULL;
}

/* ---- the batch --------------------------------------------------------------- */

/* wr_start with post_lock held */
static inline __attribute__((always_inline)) void wr_start_locked(struct ibv_qp_ex *q,
								   struct shift_qpx *x,
								   struct shift_dqp *d)
{
	x->bad = false;
	x->head = d->sq_head;
	switch (__atomic_load_n(&d->send_state, __ATOMIC_ACQUIRE)) {
	case SHIFT_SEND_DEFAULT:
		x->mode = QPX_REC;
		break;
	case SHIFT_SEND_UNPROTECTED:
		x->mode = QPX_PASS;
		break;
	default:
		qpx_hold_begin(x);
		return;
	}
	x->fn.wr_start(q);
}

/* post_lock held by another thread: waited for here (a tail call from
 * qpx_wr_start, which keeps nothing live across the wait) */
static __attribute__((noinline, cold)) void wr_start_wait(struct ibv_qp_ex *q,
							   struct shift_qpx *x,
							   struct shift_dqp *d)
{
	shift_dqp_lock_wait(d);
	wr_start_locked(q, x, d);
}

void qpx_wr_start(struct ibv_qp_ex *q)
{
	struct shift_qpx *x = qpx_find(q);
	struct shift_dqp *d;

	if (!x)
		return;
	d = x->d;
	if (shift_unlikely(!shift_dqp_trylock(d))) {
		wr_start_wait(q, x, d);
		return;
	}
	wr_start_locked(q, x, d);
}

/* A REC batch the provider refused, or one the mirror could not hold. */
static __attribute__((noinline, cold)) int rec_end(struct shift_qpx *x, int rc)
{
	struct shift_dqp *d = x->d;

	if (x->bad) {
		qpx_rollback(x);
		if (!rc)
			shift_dqp_unprotect(d, "the provider took an ibv_wr_* work request beyond "
					       "the QP's capacities (SGEs or inline data)");
		return rc;
	}
	/* the QP failed: SHIFT keeps the batch for its backup QP */
	if (shift_dp_up.post_refused(d, rc, x->head, d->rq_head))
		return 0;
	qpx_rollback(x);
	return rc;
}

int qpx_wr_complete(struct ibv_qp_ex *q)
{
	struct shift_qpx *x = qpx_find(q);
	int rc;

	if (!x)
		return EINVAL;
	switch (x->mode) {
	case QPX_REC:
		rc = x->fn.wr_complete(q);
		if (shift_unlikely(rc || x->bad))
			rc = rec_end(x, rc);
		break;
	case QPX_HOLD:
		rc = qpx_hold_post(x);
		break;
	case QPX_PASS:
		rc = x->fn.wr_complete(q);
		break;
	default:
		return x->fn.wr_complete(q); /* no batch open: the provider's answer */
	}
	x->mode = QPX_IDLE;
	shift_dqp_unlock(x->d);
	return rc;
}

void qpx_wr_abort(struct ibv_qp_ex *q)
{
	struct shift_qpx *x = qpx_find(q);

	if (!x)
		return;
	switch (x->mode) {
	case QPX_REC:
		qpx_rollback(x);
		x->fn.wr_abort(q);
		break;
	case QPX_HOLD:
		x->n = 0;
		break;
	case QPX_PASS:
		x->fn.wr_abort(q);
		break;
	default:
		x->fn.wr_abort(q);
		return;
	}
	x->mode = QPX_IDLE;
	shift_dqp_unlock(x->d);
}

/* ---- taking a QP's builders over and giving them back --------------------------- */

static void link_x(struct shift_qpx *x)
{
	struct shift_qpx **b = &shift_qpx_tab[qpx_hash(x->qx)];

	x->next = *b;
	__atomic_store_n(b, x, __ATOMIC_RELEASE);
}

static void unlink_x(struct shift_qpx *x)
{
	struct shift_qpx **pp = &shift_qpx_tab[qpx_hash(x->qx)];

	while (*pp != &shift_qpx_none && *pp != x)
		pp = &(*pp)->next;
	if (*pp == x)
		__atomic_store_n(pp, x->next, __ATOMIC_RELEASE);
}

int shift_qpx_attach(struct shift_ctx *s, struct shift_dqp *d, struct ibv_qp_ex *qx)
{
	struct shift_qpx *x;

	if (!qx->wr_start || !qx->wr_complete || !qx->wr_abort)
		return -1;
	x = calloc(1, sizeof(*x));
	if (!x)
		return -1;
	x->qx = qx;
	x->s = s;
	x->d = d;
#define QPX_SAVE(n) x->fn.n = qx->n;
	QPX_FNS(QPX_SAVE)
#undef QPX_SAVE
	pthread_mutex_lock(&reg);
	link_x(x); /* found before its builders can be called */
	qpx_install(x);
	pthread_mutex_unlock(&reg);
	return 0;
}

struct shift_qpx *shift_qpx_forget(struct ibv_qp *qp)
{
	struct shift_qpx *x;

	pthread_mutex_lock(&reg);
	x = shift_qpx_tab[qpx_hash(qp)];
	while (x != &shift_qpx_none && (void *)x->qx != (void *)qp)
		x = x->next;
	if (x == &shift_qpx_none)
		x = NULL;
	if (x) {
		qpx_give_back(x);
		unlink_x(x);
	}
	pthread_mutex_unlock(&reg);
	return x;
}

void shift_qpx_restore(struct shift_qpx *x)
{
	if (!x)
		return;
	pthread_mutex_lock(&reg);
	link_x(x);
	qpx_install(x);
	pthread_mutex_unlock(&reg);
}

void shift_qpx_free(struct shift_qpx *x)
{
	if (!x)
		return;
	free(x->wr);
	free(x->sge);
	free(x->inl);
	free(x);
}

void shift_qpx_detach_ctx(struct shift_ctx *s)
{
	pthread_mutex_lock(&reg);
	for (int i = 0; i < QPX_TAB; i++) {
		struct shift_qpx **pp = &shift_qpx_tab[i];

		while (*pp != &shift_qpx_none) {
			struct shift_qpx *x = *pp;

			if (x->s != s) {
				pp = &x->next;
				continue;
			}
			qpx_give_back(x);
			__atomic_store_n(pp, x->next, __ATOMIC_RELEASE);
			shift_qpx_free(x);
		}
	}
	pthread_mutex_unlock(&reg);
}

void shift_qpx_fork_prepare(void)
{
	pthread_mutex_lock(&reg);
}

void shift_qpx_fork_done(void)
{
	pthread_mutex_unlock(&reg);
}
