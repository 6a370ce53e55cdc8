/*
 * The lower-verbs table SHIFT uses, and its dummy slots: a backend that
 * lacks a verb gets one that fails with EOPNOTSUPP (verbs semantics: int
 * verbs return it, pointer verbs return NULL with errno set), so SHIFT never
 * calls through a NULL pointer.
 */
#include "shift/base/lower.h"
#include "shift/base/log.h"

#include <errno.h>
#include <stddef.h>
#include <string.h>

const struct shift_lower *shift_lower;
static struct shift_lower lower_filled;

static struct ibv_device **dummy_get_device_list(int *n)
{
	if (n)
		*n = 0;
	errno = EOPNOTSUPP;
	return NULL;
}
static void dummy_free_device_list(struct ibv_device **l) { (void)l; }
static const char *dummy_get_device_name(struct ibv_device *d)
{
	return d ? d->name : NULL;
}
static __be64 dummy_get_device_guid(struct ibv_device *d) { (void)d; return 0; }
static struct ibv_context *dummy_open_device(struct ibv_device *d)
{
	(void)d;
	errno = EOPNOTSUPP;
	return NULL;
}
static int dummy_ctx(struct ibv_context *c) { (void)c; return EOPNOTSUPP; }
static int dummy_query_device(struct ibv_context *c, struct ibv_device_attr *a)
{
	(void)c; (void)a;
	return EOPNOTSUPP;
}
static int dummy_query_port(struct ibv_context *c, uint8_t p, struct ibv_port_attr *a)
{
	(void)c; (void)p; (void)a;
	return EOPNOTSUPP;
}
static int dummy_query_gid(struct ibv_context *c, uint8_t p, int i, union ibv_gid *g)
{
	(void)c; (void)p; (void)i; (void)g;
	return EOPNOTSUPP;
}
static int dummy_get_async_event(struct ibv_context *c, struct ibv_async_event *e)
{
	(void)c; (void)e;
	errno = EOPNOTSUPP;
	return -1;
}
static void dummy_ack_async_event(struct ibv_async_event *e) { (void)e; }
static struct ibv_pd *dummy_alloc_pd(struct ibv_context *c)
{
	(void)c;
	errno = EOPNOTSUPP;
	return NULL;
}
static int dummy_pd(struct ibv_pd *pd) { (void)pd; return EOPNOTSUPP; }
static struct ibv_mr *dummy_reg_mr(struct ibv_pd *pd, void *a, size_t l, int f)
{
	(void)pd; (void)a; (void)l; (void)f;
	errno = EOPNOTSUPP;
	return NULL;
}
static struct ibv_mr *dummy_reg_mr_iova(struct ibv_pd *pd, void *a, size_t l,
					uint64_t i, int f)
{
	(void)pd; (void)a; (void)l; (void)i; (void)f;
	errno = EOPNOTSUPP;
	return NULL;
}
static struct ibv_mr *dummy_reg_mr_iova2(struct ibv_pd *pd, void *a, size_t l,
					 uint64_t i, unsigned int f)
{
	(void)pd; (void)a; (void)l; (void)i; (void)f;
	errno = EOPNOTSUPP;
	return NULL;
}
static struct ibv_mr *dummy_reg_dmabuf_mr(struct ibv_pd *pd, uint64_t o, size_t l,
					  uint64_t i, int fd, int f)
{
	(void)pd; (void)o; (void)l; (void)i; (void)fd; (void)f;
	errno = EOPNOTSUPP;
	return NULL;
}
static int dummy_rereg_mr(struct ibv_mr *mr, int fl, struct ibv_pd *pd, void *a,
			  size_t l, int f)
{
	(void)mr; (void)fl; (void)pd; (void)a; (void)l; (void)f;
	return EOPNOTSUPP;
}
static int dummy_dereg_mr(struct ibv_mr *mr) { (void)mr; return EOPNOTSUPP; }
static struct ibv_comp_channel *dummy_create_comp_channel(struct ibv_context *c)
{
	(void)c;
	errno = EOPNOTSUPP;
	return NULL;
}
static int dummy_destroy_comp_channel(struct ibv_comp_channel *ch)
{
	(void)ch;
	return EOPNOTSUPP;
}
static struct ibv_cq *dummy_create_cq(struct ibv_context *c, int n, void *x,
				      struct ibv_comp_channel *ch, int v)
{
	(void)c; (void)n; (void)x; (void)ch; (void)v;
	errno = EOPNOTSUPP;
	return NULL;
}
static int dummy_resize_cq(struct ibv_cq *cq, int n) { (void)cq; (void)n; return EOPNOTSUPP; }
static int dummy_cq(struct ibv_cq *cq) { (void)cq; return EOPNOTSUPP; }
static int dummy_get_cq_event(struct ibv_comp_channel *ch, struct ibv_cq **cq, void **x)
{
	(void)ch; (void)cq; (void)x;
	errno = EOPNOTSUPP;
	return -1;
}
static void dummy_ack_cq_events(struct ibv_cq *cq, unsigned int n) { (void)cq; (void)n; }
static struct ibv_qp *dummy_create_qp(struct ibv_pd *pd, struct ibv_qp_init_attr *a)
{
	(void)pd; (void)a;
	errno = EOPNOTSUPP;
	return NULL;
}
static int dummy_modify_qp(struct ibv_qp *qp, struct ibv_qp_attr *a, int m)
{
	(void)qp; (void)a; (void)m;
	return EOPNOTSUPP;
}
static int dummy_query_qp(struct ibv_qp *qp, struct ibv_qp_attr *a, int m,
			  struct ibv_qp_init_attr *i)
{
	(void)qp; (void)a; (void)m; (void)i;
	return EOPNOTSUPP;
}
static int dummy_qp(struct ibv_qp *qp) { (void)qp; return EOPNOTSUPP; }
static int dummy_ece(struct ibv_qp *qp, struct ibv_ece *e) { (void)qp; (void)e; return EOPNOTSUPP; }
static struct ibv_srq *dummy_create_srq(struct ibv_pd *pd, struct ibv_srq_init_attr *a)
{
	(void)pd; (void)a;
	errno = EOPNOTSUPP;
	return NULL;
}
static int dummy_modify_srq(struct ibv_srq *srq, struct ibv_srq_attr *a, int m)
{
	(void)srq; (void)a; (void)m;
	return EOPNOTSUPP;
}
static int dummy_query_srq(struct ibv_srq *srq, struct ibv_srq_attr *a)
{
	(void)srq; (void)a;
	return EOPNOTSUPP;
}
static int dummy_srq(struct ibv_srq *srq) { (void)srq; return EOPNOTSUPP; }
static struct ibv_ah *dummy_create_ah(struct ibv_pd *pd, struct ibv_ah_attr *a)
{
	(void)pd; (void)a;
	errno = EOPNOTSUPP;
	return NULL;
}
static int dummy_destroy_ah(struct ibv_ah *ah) { (void)ah; return EOPNOTSUPP; }

#define FILL(slot, fn)                         \
	do {                                   \
		if (!lower_filled.slot)        \
			lower_filled.slot = fn; \
	} while (0)

void shift_lower_set(const struct shift_lower *lower)
{
	if (!lower) {
		shift_lower = NULL;
		return;
	}
	lower_filled = *lower;
	FILL(get_device_list, dummy_get_device_list);
	FILL(free_device_list, dummy_free_device_list);
	FILL(get_device_name, dummy_get_device_name);
	FILL(get_device_guid, dummy_get_device_guid);
	FILL(open_device, dummy_open_device);
	FILL(close_device, dummy_ctx);
	FILL(query_device, dummy_query_device);
	FILL(query_port, dummy_query_port);
	FILL(query_gid, dummy_query_gid);
	FILL(get_async_event, dummy_get_async_event);
	FILL(ack_async_event, dummy_ack_async_event);
	FILL(alloc_pd, dummy_alloc_pd);
	FILL(dealloc_pd, dummy_pd);
	FILL(reg_mr, dummy_reg_mr);
	FILL(reg_mr_iova, dummy_reg_mr_iova);
	FILL(reg_mr_iova2, dummy_reg_mr_iova2);
	FILL(reg_dmabuf_mr, dummy_reg_dmabuf_mr);
	FILL(rereg_mr, dummy_rereg_mr);
	FILL(dereg_mr, dummy_dereg_mr);
	FILL(create_comp_channel, dummy_create_comp_channel);
	FILL(destroy_comp_channel, dummy_destroy_comp_channel);
	FILL(create_cq, dummy_create_cq);
	FILL(resize_cq, dummy_resize_cq);
	FILL(destroy_cq, dummy_cq);
	FILL(get_cq_event, dummy_get_cq_event);
	FILL(ack_cq_events, dummy_ack_cq_events);
	FILL(create_qp, dummy_create_qp);
	FILL(modify_qp, dummy_modify_qp);
	FILL(query_qp, dummy_query_qp);
	FILL(destroy_qp, dummy_qp);
	FILL(query_ece, dummy_ece);
	FILL(set_ece, dummy_ece);
	FILL(create_srq, dummy_create_srq);
	FILL(modify_srq, dummy_modify_srq);
	FILL(query_srq, dummy_query_srq);
	FILL(destroy_srq, dummy_srq);
	FILL(create_ah, dummy_create_ah);
	FILL(destroy_ah, dummy_destroy_ah);
	if (!lower_filled.name)
		lower_filled.name = "unnamed";
	__atomic_store_n(&shift_lower, &lower_filled, __ATOMIC_RELEASE);
}
