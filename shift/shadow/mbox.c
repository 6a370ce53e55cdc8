/*
 * The key mailboxes' memory (mbox.h): pages of slots registered on each
 * backup PD, a slot per QP whose backup grants remote writes, on the
 * RNIC's thread (its replay and its reap).
 */
#include "shift/shadow/mbox.h"
#include "shift/shadow/shadow_int.h"
#include "shift/base/log.h"
#include "shift/base/lower.h"

#include <stdlib.h>
#include <string.h>

_Static_assert(SHIFT_MBOX_PER_PAGE >= 8 && SHIFT_MBOX_PER_PAGE <= 32, "slots per page");

struct shift_mbox_page {
	struct shift_mbox_page *next;
	struct shift_mbox_slot *mem; /* SHIFT_MBOX_PAGE bytes, page-aligned */
	struct ibv_mr *mr;
	uint32_t used; /* bit i: slot i taken */
};

static uint64_t mix(uint64_t h, uint64_t v)
{
	h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
	h ^= h >> 31;
	h *= 0xbf58476d1ce4e5b9ull;
	return h ^ (h >> 29);
}

uint64_t shift_mbox_req_check(const struct shift_mbox_req *m)
{
	return mix(mix(0x5348494654524551ull, m->nonce), m->rkey);
}

uint64_t shift_mbox_ans_check(const struct shift_mbox_ans *m)
{
	uint64_t h = mix(mix(0x5348494654414e53ull, m->nonce), m->rkey);

	h = mix(h, ((uint64_t)m->flags << 32) | m->bk);
	return mix(mix(h, m->addr), m->len);
}

#define LOAD(p) __atomic_load_n(&(p), __ATOMIC_RELAXED)

void shift_mbox_read_req(const struct shift_mbox_req *src, struct shift_mbox_req *out)
{
	out->nonce = LOAD(src->nonce);
	out->rkey = LOAD(src->rkey);
	out->pad = 0;
	out->check = LOAD(src->check);
}

void shift_mbox_read_ans(const struct shift_mbox_ans *src, struct shift_mbox_ans *out)
{
	out->nonce = LOAD(src->nonce);
	out->rkey = LOAD(src->rkey);
	out->flags = LOAD(src->flags);
	out->bk = LOAD(src->bk);
	out->pad = 0;
	out->addr = LOAD(src->addr);
	out->len = LOAD(src->len);
	out->check = LOAD(src->check);
}

#define ALL_SLOTS ((uint32_t)((1ull << SHIFT_MBOX_PER_PAGE) - 1))

static struct shift_mbox_page *page_new(struct shift_pd *p)
{
	struct shift_mbox_page *pg = calloc(1, sizeof(*pg));
	void *mem = NULL;

	if (!pg || posix_memalign(&mem, SHIFT_MBOX_PAGE, SHIFT_MBOX_PAGE)) {
		free(pg);
		return NULL;
	}
	memset(mem, 0, SHIFT_MBOX_PAGE);
	pg->mem = mem;
	pg->mr = shift_lower->reg_mr(p->bk, mem, SHIFT_MBOX_PAGE,
				     IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	if (!pg->mr) {
		free(mem);
		free(pg);
		return NULL;
	}
	pg->next = p->mbox;
	p->mbox = pg;
	return pg;
}

bool shift_mbox_attach(struct shift_qp *q)
{
	struct shift_pd *p = q->pd;
	struct shift_mbox_page *pg;

	if (q->mb || !p || !p->bk)
		return q->mb != NULL;
	for (pg = p->mbox; pg && pg->used == ALL_SLOTS; pg = pg->next)
		;
	if (!pg && !(pg = page_new(p))) {
		shift_debug("QP %u: no key mailbox (cannot register its memory on the backup PD)",
			    q->app_qpn);
		return false;
	}
	unsigned i = (unsigned)__builtin_ctz(~pg->used);

	pg->used |= 1u << i;
	q->mb = &pg->mem[i];
	memset(q->mb, 0, sizeof(*q->mb));
	q->mb_page = pg;
	q->mb_lkey = pg->mr->lkey;
	q->my_bk.has_mb = true;
	q->my_bk.mb_addr = (uint64_t)(uintptr_t)q->mb;
	q->my_bk.mb_rkey = pg->mr->rkey;
	return true;
}

void shift_mbox_detach(struct shift_qp *q)
{
	struct shift_mbox_page *pg = q->mb_page;

	if (!pg)
		return;
	unsigned i = (unsigned)(q->mb - pg->mem);

	memset(q->mb, 0, sizeof(*q->mb));
	pg->used &= ~(1u << i);
	q->mb = NULL;
	q->mb_page = NULL;
}

void shift_mbox_free_pd(struct shift_pd *p)
{
	while (p->mbox) {
		struct shift_mbox_page *pg = p->mbox;

		p->mbox = pg->next;
		shift_lower->dereg_mr(pg->mr);
		free(pg->mem);
		free(pg);
	}
}

int shift_shadow_own_mr(struct shift_rnic *r, const struct shift_qp *q, uint32_t app_rkey,
			struct shift_mr_value *out)
{
	const unsigned remote = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
				IBV_ACCESS_REMOTE_ATOMIC;
	int found = 0;

	pthread_mutex_lock(&r->lock);
	for (struct shift_mr *m = r->mrs; m && found <= 0; m = m->next) {
		if (m->app_rkey != app_rkey || m->pd != q->pd || m->dead || !(m->access & remote))
			continue;
		if (m->state == SHIFT_SHADOW_PENDING) {
			found = -1; /* (registered a moment ago: its replay comes) */
			continue;
		}
		if (!m->bk || m->state != SHIFT_SHADOW_READY)
			continue;
		shift_mr_value_of(m, out);
		found = 1;
	}
	pthread_mutex_unlock(&r->lock);
	return found;
}
