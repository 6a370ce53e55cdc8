/*
 * Control verbs of the simulated RNIC: devices and contexts, queries, async
 * events, protection domains, memory regions, completion channels and CQs,
 * and the lower-verbs table (sim_lower_proto) that world.c copies per host.
 *
 * Real file descriptors back what applications wait on: a context's
 * async_fd is the read end of a pipe carrying one byte per queued async
 * event; a completion channel's fd is a pipe carrying one CQ pointer per
 * completion event. Both can be poll()ed or set O_NONBLOCK like the real
 * ones. Nothing here blocks the simulation: events are produced by
 * sim_world_step() in the same thread.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "sim_int.h"


/* --- devices and contexts ------------------------------------------------ */

static void sim_free_device_list(struct ibv_device **list)
{
	free(list);
}

static const char *sim_get_device_name(struct ibv_device *device)
{
	return device->name;
}

static __be64 sim_get_device_guid(struct ibv_device *device)
{
	return ((struct sim_dev *)device)->guid;
}

struct sim_dev *sim_dev_of_context(struct ibv_context *ctx)
{
	return ((struct sim_ctx *)verbs_get_ctx(ctx))->dev;
}

static struct sim_ctx *to_ctx(struct ibv_context *c)
{
	return (struct sim_ctx *)verbs_get_ctx(c);
}

static int sim_query_device(struct ibv_context *c, struct ibv_device_attr *a)
{
	struct sim_dev *d = to_ctx(c)->dev;

	memset(a, 0, sizeof(*a));
	snprintf(a->fw_ver, sizeof(a->fw_ver), "sim-1.0");
	a->node_guid = d->guid;
	a->sys_image_guid = d->guid;
	a->max_mr_size = UINT64_MAX;
	a->page_size_cap = 4096;
	a->vendor_id = 0x5348;
	a->vendor_part_id = 1;
	if (d->w->opts.mlx5) {
		a->vendor_id = 0x02c9;      /* Mellanox */
		a->vendor_part_id = 4123;   /* ConnectX-6 */
	} else if (d->w->opts.vendor_id || d->w->opts.vendor_part_id) {
		a->vendor_id = d->w->opts.vendor_id;
		a->vendor_part_id = d->w->opts.vendor_part_id;
	}
	a->max_qp = 4096;
	a->max_qp_wr = SIM_MAX_WR;
	a->device_cap_flags = IBV_DEVICE_RC_RNR_NAK_GEN |
			      IBV_DEVICE_PORT_ACTIVE_EVENT;
	a->max_sge = SIM_MAX_SGE;
	a->max_sge_rd = SIM_MAX_SGE;
	a->max_cq = 4096;
	a->max_cqe = SIM_MAX_CQE;
	a->max_mr = 1 << 20;
	a->max_pd = 1 << 16;
	a->max_qp_rd_atom = SIM_MAX_RD_ATOMIC;
	a->max_qp_init_rd_atom = SIM_MAX_RD_ATOMIC;
	a->max_res_rd_atom = SIM_MAX_RD_ATOMIC * 4096;
	a->atomic_cap = IBV_ATOMIC_HCA;
	a->max_pkeys = 1;
	a->phys_port_cnt = 1;
	return 0;
}

static int sim_query_device_ex(struct ibv_context *c,
			       const struct ibv_query_device_ex_input *in,
			       struct ibv_device_attr_ex *a, size_t sz)
{
	(void)in;
	if (sz < sizeof(a->orig_attr))
		return EINVAL;
	memset(a, 0, sz);
	sim_query_device(c, &a->orig_attr);
	if (sz >= offsetof(struct ibv_device_attr_ex, phys_port_cnt_ex) +
			  sizeof(a->phys_port_cnt_ex))
		a->phys_port_cnt_ex = 1;
	return 0;
}

int sim_query_port(struct ibv_context *c, uint8_t port,
		   struct ibv_port_attr *pa)
{
	struct sim_dev *d = to_ctx(c)->dev;

	if (port != 1)
		return EINVAL;
	memset(pa, 0, sizeof(*pa));
	pa->state = d->port_state;
	pa->max_mtu = IBV_MTU_4096;
	pa->active_mtu = IBV_MTU_1024;
	pa->gid_tbl_len = 2;
	pa->port_cap_flags = IBV_PORT_CM_SUP;
	pa->max_msg_sz = 1u << 31;
	pa->pkey_tbl_len = 1;
	pa->lid = d->lid;
	pa->max_vl_num = 1;
	pa->active_width = 2;	/* 4x */
	pa->active_speed = 32;	/* EDR */
	pa->phys_state = d->port_state == IBV_PORT_ACTIVE ? 5 : 3;
	pa->link_layer = IBV_LINK_LAYER_ETHERNET;
	return 0;
}

static int sim_query_port_ex(struct ibv_context *c, uint8_t port,
			     struct ibv_port_attr *pa, size_t len)
{
	struct ibv_port_attr full;
	int rc = sim_query_port(c, port, &full);

	if (!rc)
		memcpy(pa, &full, len < sizeof(full) ? len : sizeof(full));
	return rc;
}

static int sim_query_gid(struct ibv_context *c, uint8_t port, int index,
			 union ibv_gid *gid)
{
	struct sim_dev *d = to_ctx(c)->dev;

	if (port != 1 || index < 0 || index > 1)
		return EINVAL;
	*gid = d->gid[index];
	return 0;
}

static struct ibv_cq_ex *sim_create_cq_ex(struct ibv_context *c,
					  struct ibv_cq_init_attr_ex *ia);

/* Slots the sim does not implement fail cleanly instead of being NULL. */
static struct ibv_mw *sim_alloc_mw(struct ibv_pd *pd, enum ibv_mw_type type)
{
	(void)pd; (void)type;
	errno = EOPNOTSUPP;
	return NULL;
}

static struct ibv_context *sim_open_device(struct ibv_device *device)
{
	struct sim_dev *d = (struct sim_dev *)device;
	struct sim_ctx *ctx;
	int fds[2];

	if (d->fatal) {
		errno = EIO;
		return NULL;
	}
	ctx = calloc(1, sizeof(*ctx));
	if (!ctx)
		return NULL;
	if (pipe2(fds, O_CLOEXEC)) {
		free(ctx);
		return NULL;
	}
	ctx->dev = d;
	ctx->async_wfd = fds[1];
	ctx->vctx.sz = sizeof(ctx->vctx);
	ctx->vctx.query_port = sim_query_port_ex;
	ctx->vctx.query_device_ex = sim_query_device_ex;
	ctx->vctx.create_qp_ex = sim_create_qp_ex;
	ctx->vctx.create_cq_ex = sim_create_cq_ex;
	ctx->vctx.create_srq_ex = sim_create_srq_ex;
	struct ibv_context *c = &ctx->vctx.context;

	c->device = device;
	c->cmd_fd = -1;
	c->async_fd = fds[0];
	c->num_comp_vectors = 1;
	c->abi_compat = __VERBS_ABI_IS_EXTENDED;
	pthread_mutex_init(&c->mutex, NULL);
	c->ops.poll_cq = sim_poll_cq;
	c->ops.req_notify_cq = sim_req_notify_cq;
	c->ops.post_send = sim_post_send;
	c->ops.post_recv = sim_post_recv;
	c->ops.post_srq_recv = sim_post_srq_recv;
	c->ops.alloc_mw = sim_alloc_mw;
	ctx->next = d->ctxs;
	d->ctxs = ctx;
	return c;
}

static void sim_cq_free(struct sim_cq *cq)
{
	pthread_mutex_destroy(&cq->cq.mutex);
	pthread_cond_destroy(&cq->cq.cond);
	free(cq->ring);
	free(cq);
}

/* Frees a context and whatever the application left on it. */
static void sim_ctx_free(struct sim_ctx *ctx)
{
	struct sim_dev *d = ctx->dev;
	struct sim_world *w = d->w;

	for (struct sim_qp *q = w->qps, *nx; q; q = nx) {
		nx = q->wnext;
		if (q->ctx == ctx)
			sim_qp_free(q);
	}
	for (unsigned k = 0; k < SIM_UD_QPS; k++)
		if (d->ud_qps[k] && d->ud_qps[k]->ctx == ctx)
			sim_qp_free(d->ud_qps[k]);
	for (unsigned i = 0; i < d->nmrs; i++) {
		if (d->mrs[i] && d->mrs[i]->mr.context == &ctx->vctx.context) {
			free(d->mrs[i]);
			d->mrs[i] = NULL;
		}
	}
	sim_srq_free_all(ctx);
	while (ctx->cqs) {
		struct sim_cq *cq = ctx->cqs;

		ctx->cqs = cq->next;
		sim_cq_free(cq);
	}
	while (ctx->pds) {
		struct sim_pd *pd = ctx->pds;

		ctx->pds = pd->next;
		free(pd);
	}
	while (ctx->chans) {
		struct sim_channel *ch = ctx->chans;

		ctx->chans = ch->next;
		close(ch->ch.fd);
		close(ch->wfd);
		free(ch);
	}
	close(ctx->vctx.context.async_fd);
	close(ctx->async_wfd);
	pthread_mutex_destroy(&ctx->vctx.context.mutex);
	free(ctx);
}

void sim_ctx_free_all(struct sim_dev *d)
{
	while (d->ctxs) {
		struct sim_ctx *ctx = d->ctxs;

		d->ctxs = ctx->next;
		sim_ctx_free(ctx);
	}
}

static int sim_close_device(struct ibv_context *c)
{
	struct sim_ctx *ctx = to_ctx(c);
	struct sim_ctx **pp = &ctx->dev->ctxs;

	while (*pp && *pp != ctx)
		pp = &(*pp)->next;
	if (!*pp)
		return EINVAL;
	*pp = ctx->next;
	sim_ctx_free(ctx);
	return 0;
}

/* --- async events -------------------------------------------------------- */

void sim_async(struct sim_ctx *ctx, enum ibv_event_type type, void *obj,
	       int port)
{
	struct ibv_async_event *ev;
	char b = 1;

	if (ctx->async_count == SIM_ASYNC_RING)
		return;	/* like a full kernel queue: the event is lost */
	ev = &ctx->async[(ctx->async_head + ctx->async_count) % SIM_ASYNC_RING];
	memset(ev, 0, sizeof(*ev));
	ev->event_type = type;
	switch (type) {
	case IBV_EVENT_CQ_ERR:
		ev->element.cq = obj;
		break;
	case IBV_EVENT_PORT_ACTIVE:
	case IBV_EVENT_PORT_ERR:
		ev->element.port_num = port;
		break;
	case IBV_EVENT_DEVICE_FATAL:
		break;
	default:
		ev->element.qp = obj;
		break;
	}
	ctx->async_count++;
	if (write(ctx->async_wfd, &b, 1) != 1)
		abort();
	sim_trace(ctx->dev->w, 0x41535943 /* "CYSA" */, ctx->dev->gidx, type);
}

void sim_dev_async(struct sim_dev *d, enum ibv_event_type type)
{
	for (struct sim_ctx *ctx = d->ctxs; ctx; ctx = ctx->next)
		sim_async(ctx, type, NULL, 1);
}

static int sim_get_async_event(struct ibv_context *c,
			       struct ibv_async_event *event)
{
	struct sim_ctx *ctx = to_ctx(c);
	char b;
	ssize_t n = read(c->async_fd, &b, 1);

	if (n != 1)
		return -1;	/* errno from read, e.g. EAGAIN */
	if (!ctx->async_count) {
		errno = EIO;
		return -1;
	}
	*event = ctx->async[ctx->async_head];
	ctx->async_head = (ctx->async_head + 1) % SIM_ASYNC_RING;
	ctx->async_count--;
	return 0;
}

static void sim_ack_async_event(struct ibv_async_event *event)
{
	switch (event->event_type) {
	case IBV_EVENT_CQ_ERR:
		event->element.cq->async_events_completed++;
		break;
	case IBV_EVENT_PORT_ACTIVE:
	case IBV_EVENT_PORT_ERR:
	case IBV_EVENT_DEVICE_FATAL:
		break;
	case IBV_EVENT_SRQ_LIMIT_REACHED:
	case IBV_EVENT_SRQ_ERR:
		event->element.srq->events_completed++;
		break;
	default:
		if (event->element.qp)
			event->element.qp->events_completed++;
		break;
	}
}

/* --- PD and MR ----------------------------------------------------------- */

static struct ibv_pd *sim_alloc_pd(struct ibv_context *c)
{
	struct sim_ctx *ctx = to_ctx(c);
	struct sim_pd *pd = calloc(1, sizeof(*pd));
	static uint32_t handle;

	if (!pd)
		return NULL;
	pd->pd.context = c;
	pd->pd.handle = ++handle;
	pd->next = ctx->pds;
	ctx->pds = pd;
	return &pd->pd;
}

static int sim_dealloc_pd(struct ibv_pd *ibpd)
{
	struct sim_ctx *ctx = to_ctx(ibpd->context);
	struct sim_dev *d = ctx->dev;
	struct sim_pd **pp = &ctx->pds;

	for (unsigned i = 0; i < d->nmrs; i++)
		if (d->mrs[i] && d->mrs[i]->mr.pd == ibpd)
			return EBUSY;
	for (struct sim_qp *q = d->w->qps; q; q = q->wnext)
		if (q->qp.pd == ibpd)
			return EBUSY;
	while (*pp && &(*pp)->pd != ibpd)
		pp = &(*pp)->next;
	if (!*pp)
		return EINVAL;
	struct sim_pd *pd = *pp;

	*pp = pd->next;
	free(pd);
	return 0;
}

#define SIM_ACCESS_ALL (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | \
			IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC | \
			IBV_ACCESS_RELAXED_ORDERING)

struct sim_mr *sim_mr_lookup(struct sim_dev *d, uint32_t key)
{
	unsigned i = key >> 8;

	if (i < d->nmrs && d->mrs[i] && d->mrs[i]->mr.lkey == key)
		return d->mrs[i];
	return NULL;
}

static struct ibv_mr *sim_reg_mr_iova2(struct ibv_pd *pd, void *addr,
				       size_t length, uint64_t iova,
				       unsigned int access)
{
	struct sim_dev *d = to_ctx(pd->context)->dev;
	struct sim_mr *mr;
	unsigned i;

	if ((access & ~SIM_ACCESS_ALL) ||
	    /* the verbs rule: remote write or atomic needs local write */
	    ((access & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC)) &&
	     !(access & IBV_ACCESS_LOCAL_WRITE)) ||
	    (!addr && length)) {
		errno = EINVAL;
		return NULL;
	}
	for (i = 0; i < d->nmrs && d->mrs[i]; i++)
		;
	if (i == d->nmrs) {
		unsigned cap = d->nmrs ? 2 * d->nmrs : 16;
		void *p = realloc(d->mrs, cap * sizeof(*d->mrs));

		if (!p || cap > (1u << 24)) {
			errno = ENOMEM;
			return NULL;
		}
		d->mrs = p;
		memset(d->mrs + d->nmrs, 0, (cap - d->nmrs) * sizeof(*d->mrs));
		d->nmrs = cap;
	}
	mr = calloc(1, sizeof(*mr));
	if (!mr)
		return NULL;
	mr->dev = d;
	mr->iova = iova;
	mr->access = access;
	mr->mr.context = pd->context;
	mr->mr.pd = pd;
	mr->mr.addr = addr;
	mr->mr.length = length;
	mr->mr.handle = i;
	mr->mr.lkey = mr->mr.rkey = i << 8 | (++d->key_seq & 0xff);
	d->mrs[i] = mr;
	return &mr->mr;
}

static struct ibv_mr *sim_reg_mr(struct ibv_pd *pd, void *addr, size_t length,
				 int access)
{
	return sim_reg_mr_iova2(pd, addr, length, (uintptr_t)addr,
				(unsigned)access);
}

static struct ibv_mr *sim_reg_mr_iova(struct ibv_pd *pd, void *addr,
				      size_t length, uint64_t iova, int access)
{
	return sim_reg_mr_iova2(pd, addr, length, iova, (unsigned)access);
}

static struct ibv_mr *sim_reg_dmabuf_mr(struct ibv_pd *pd, uint64_t offset,
					size_t length, uint64_t iova, int fd,
					int access)
{
	(void)pd; (void)offset; (void)length; (void)iova; (void)fd;
	(void)access;
	errno = EOPNOTSUPP;
	return NULL;
}

static int sim_dereg_mr(struct ibv_mr *ibmr)
{
	struct sim_mr *mr = (struct sim_mr *)ibmr;
	struct sim_dev *d = mr->dev;

	if (sim_mr_lookup(d, ibmr->lkey) != mr)
		return EINVAL;
	d->mrs[ibmr->lkey >> 8] = NULL;
	free(mr);
	return 0;
}

static int sim_rereg_mr(struct ibv_mr *ibmr, int flags, struct ibv_pd *pd,
			void *addr, size_t length, int access)
{
	struct sim_mr *mr = (struct sim_mr *)ibmr;

	if (flags & ~(IBV_REREG_MR_CHANGE_TRANSLATION | IBV_REREG_MR_CHANGE_PD |
		      IBV_REREG_MR_CHANGE_ACCESS))
		return EINVAL;
	if (flags & IBV_REREG_MR_CHANGE_TRANSLATION) {
		ibmr->addr = addr;
		ibmr->length = length;
		mr->iova = (uintptr_t)addr;
	}
	if (flags & IBV_REREG_MR_CHANGE_PD)
		ibmr->pd = pd;
	if (flags & IBV_REREG_MR_CHANGE_ACCESS)
		mr->access = (unsigned)access;
	return 0;
}

/* --- completion channels and CQs ----------------------------------------- */

static struct ibv_comp_channel *sim_create_comp_channel(struct ibv_context *c)
{
	struct sim_ctx *ctx = to_ctx(c);
	struct sim_channel *ch = calloc(1, sizeof(*ch));
	int fds[2];

	if (!ch)
		return NULL;
	if (pipe2(fds, O_CLOEXEC)) {
		free(ch);
		return NULL;
	}
	ch->ch.context = c;
	ch->ch.fd = fds[0];
	ch->wfd = fds[1];
	ch->next = ctx->chans;
	ctx->chans = ch;
	return &ch->ch;
}

static int sim_destroy_comp_channel(struct ibv_comp_channel *chan)
{
	struct sim_ctx *ctx = to_ctx(chan->context);
	struct sim_channel **pp = &ctx->chans;

	if (chan->refcnt)
		return EBUSY;
	while (*pp && &(*pp)->ch != chan)
		pp = &(*pp)->next;
	if (!*pp)
		return EINVAL;
	struct sim_channel *ch = *pp;

	*pp = ch->next;
	close(ch->ch.fd);
	close(ch->wfd);
	free(ch);
	return 0;
}

static struct sim_cq *sim_cq_new(struct ibv_context *c, int cqe,
				 void *cq_context,
				 struct ibv_comp_channel *channel)
{
	struct sim_ctx *ctx = to_ctx(c);
	struct sim_cq *cq;

	if (cqe < 1 || cqe > SIM_MAX_CQE) {
		errno = EINVAL;
		return NULL;
	}
	cq = calloc(1, sizeof(*cq));
	if (!cq)
		return NULL;
	cq->cap = (unsigned)cqe;
	cq->ring = calloc(cq->cap, sizeof(*cq->ring));
	if (!cq->ring) {
		free(cq);
		return NULL;
	}
	cq->ctx = ctx;
	cq->cq.context = c;
	cq->cq.channel = channel;
	cq->cq.cq_context = cq_context;
	cq->cq.cqe = cqe;
	pthread_mutex_init(&cq->cq.mutex, NULL);
	pthread_cond_init(&cq->cq.cond, NULL);
	if (channel)
		channel->refcnt++;
	sim_cq_ex_init(cq);
	cq->next = ctx->cqs;
	ctx->cqs = cq;
	return cq;
}

static struct ibv_cq *sim_create_cq(struct ibv_context *c, int cqe,
				    void *cq_context,
				    struct ibv_comp_channel *channel,
				    int comp_vector)
{
	struct sim_cq *cq;

	if (comp_vector != 0) {
		errno = EINVAL;
		return NULL;
	}
	cq = sim_cq_new(c, cqe, cq_context, channel);
	return cq ? ibv_cq_ex_to_cq(&cq->cq) : NULL;
}

static struct ibv_cq_ex *sim_create_cq_ex(struct ibv_context *c,
					  struct ibv_cq_init_attr_ex *ia)
{
	struct sim_cq *cq;

	if (ia->comp_vector != 0 ||
	    (ia->comp_mask & ~(uint32_t)(IBV_CQ_INIT_ATTR_MASK_FLAGS |
					 IBV_CQ_INIT_ATTR_MASK_PD))) {
		errno = EINVAL;
		return NULL;
	}
	if (ia->wc_flags & ~(uint64_t)(IBV_WC_STANDARD_FLAGS |
				       IBV_WC_EX_WITH_COMPLETION_TIMESTAMP)) {
		errno = EOPNOTSUPP;
		return NULL;
	}
	cq = sim_cq_new(c, (int)ia->cqe, ia->cq_context, ia->channel);
	if (cq && (ia->wc_flags & IBV_WC_EX_WITH_COMPLETION_TIMESTAMP))
		sim_cq_ex_timestamps(cq);
	return cq ? &cq->cq : NULL;
}

static int sim_resize_cq(struct ibv_cq *ibcq, int cqe)
{
	struct sim_cq *cq = (struct sim_cq *)ibcq;
	struct ibv_wc *ring;

	if (cqe < 1 || cqe > SIM_MAX_CQE || (unsigned)cqe < cq->count)
		return EINVAL;
	ring = calloc((size_t)cqe, sizeof(*ring));
	if (!ring)
		return ENOMEM;
	for (unsigned i = 0; i < cq->count; i++)
		ring[i] = cq->ring[(cq->head + i) % cq->cap];
	free(cq->ring);
	cq->ring = ring;
	cq->head = 0;
	cq->cap = (unsigned)cqe;
	ibcq->cqe = cqe;
	return 0;
}

static int sim_destroy_cq(struct ibv_cq *ibcq)
{
	struct sim_cq *cq = (struct sim_cq *)ibcq;
	struct sim_ctx *ctx = cq->ctx;
	struct sim_cq **pp = &ctx->cqs;

	for (struct sim_qp *q = ctx->dev->w->qps; q; q = q->wnext)
		if (q->qp.send_cq == ibcq || q->qp.recv_cq == ibcq)
			return EBUSY;
	while (*pp && *pp != cq)
		pp = &(*pp)->next;
	if (!*pp)
		return EINVAL;
	/* rdma-core waits here until every event get_cq_event returned has
	 * been acked (comp_events_completed == the kernel's count): a wrong
	 * count would hang it forever; the sim refuses instead */
	if (__atomic_load_n(&ibcq->comp_events_completed, __ATOMIC_RELAXED) !=
	    __atomic_load_n(&cq->events_reported, __ATOMIC_RELAXED))
		return EDEADLK;
	*pp = cq->next;
	if (ibcq->channel)
		ibcq->channel->refcnt--;
	sim_cq_free(cq);
	return 0;
}

/* Appends a completion; raises the channel event if the CQ is armed for it.
 * An overflow loses the entry and raises IBV_EVENT_CQ_ERR once. */
void sim_cq_push(struct sim_cq *cq, const struct ibv_wc *wc, bool solicited)
{
	if (cq->count == cq->cap) {
		if (!cq->overflow) {
			cq->overflow = true;
			sim_async(cq->ctx, IBV_EVENT_CQ_ERR, &cq->cq, 0);
		}
		return;
	}
	cq->ring[(cq->head + cq->count) % cq->cap] = *wc;
	cq->count++;
	if (cq->armed == 1 ||
	    (cq->armed == 2 && (solicited || wc->status != IBV_WC_SUCCESS))) {
		struct ibv_cq *ibcq = ibv_cq_ex_to_cq(&cq->cq);
		struct sim_channel *ch = (struct sim_channel *)ibcq->channel;

		cq->armed = 0;
		if (ch && write(ch->wfd, &ibcq, sizeof(ibcq)) != sizeof(ibcq))
			abort();
	}
}

/* Drops the completions of one QP (on destroy and reset, like mlx5). */
void sim_cq_purge(struct sim_cq *cq, uint32_t qpn)
{
	unsigned keep = 0;

	for (unsigned i = 0; i < cq->count; i++) {
		struct ibv_wc wc = cq->ring[(cq->head + i) % cq->cap];

		if (wc.qp_num != qpn)
			cq->ring[(cq->head + keep++) % cq->cap] = wc;
	}
	cq->count = keep;
}

static int sim_get_cq_event(struct ibv_comp_channel *chan, struct ibv_cq **cq,
			    void **cq_context)
{
	struct ibv_cq *ibcq;

	if (read(chan->fd, &ibcq, sizeof(ibcq)) != sizeof(ibcq))
		return -1;
	*cq = ibcq;
	*cq_context = ibcq->cq_context;
	__atomic_fetch_add(&((struct sim_cq *)ibcq)->events_reported, 1, __ATOMIC_RELAXED);
	return 0;
}

unsigned sim_cq_events_reported(struct ibv_cq *cq)
{
	return __atomic_load_n(&((struct sim_cq *)cq)->events_reported, __ATOMIC_RELAXED);
}

static void sim_ack_cq_events(struct ibv_cq *cq, unsigned int nevents)
{
	__atomic_fetch_add(&cq->comp_events_completed, nevents, __ATOMIC_RELAXED);
}

/* --- ECE: not supported, like most providers ----------------------------- */

static int sim_query_ece(struct ibv_qp *qp, struct ibv_ece *ece)
{
	(void)qp; (void)ece;
	return EOPNOTSUPP;
}

static int sim_set_ece(struct ibv_qp *qp, struct ibv_ece *ece)
{
	(void)qp; (void)ece;
	return EOPNOTSUPP;
}

const struct shift_lower sim_lower_proto = {
	.name = "sim",
	.get_device_list = NULL, /* per host, see world.c */
	.free_device_list = sim_free_device_list,
	.get_device_name = sim_get_device_name,
	.get_device_guid = sim_get_device_guid,
	.open_device = sim_open_device,
	.close_device = sim_close_device,
	.query_device = sim_query_device,
	.query_port = sim_query_port,
	.query_gid = sim_query_gid,
	.get_async_event = sim_get_async_event,
	.ack_async_event = sim_ack_async_event,
	.alloc_pd = sim_alloc_pd,
	.dealloc_pd = sim_dealloc_pd,
	.reg_mr = sim_reg_mr,
	.reg_mr_iova = sim_reg_mr_iova,
	.reg_mr_iova2 = sim_reg_mr_iova2,
	.reg_dmabuf_mr = sim_reg_dmabuf_mr,
	.rereg_mr = sim_rereg_mr,
	.dereg_mr = sim_dereg_mr,
	.create_comp_channel = sim_create_comp_channel,
	.destroy_comp_channel = sim_destroy_comp_channel,
	.create_cq = sim_create_cq,
	.resize_cq = sim_resize_cq,
	.destroy_cq = sim_destroy_cq,
	.get_cq_event = sim_get_cq_event,
	.ack_cq_events = sim_ack_cq_events,
	.create_qp = sim_create_qp,
	.modify_qp = sim_modify_qp,
	.query_qp = sim_query_qp,
	.destroy_qp = sim_destroy_qp,
	.query_ece = sim_query_ece,
	.set_ece = sim_set_ece,
	.qp_to_qp_ex = ibv_qp_to_qp_ex, /* the sim's (qpex.c) */
	.create_srq = sim_create_srq,
	.modify_srq = sim_modify_srq,
	.query_srq = sim_query_srq,
	.destroy_srq = sim_destroy_srq,
	.mlx5dv_init_obj = sim_mlx5dv_init_obj,
	.create_ah = sim_create_ah,
	.destroy_ah = sim_destroy_ah,
};
