/* rdma.c - the verbs objects of shift-nccl-check: open the device, one PD and
 * one CQ, and per channel a registered buffer and an RC QP; then take the QPs
 * through INIT, RTR and RTS toward the peer's QPs. Plain, unmodified-style
 * verbs use, exactly what SHIFT must make survive NIC failures. */
#include "nccl_check.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void verb_fail(struct nc_ctx *c, int qp, const char *op, int err)
{
	if (err == 0)
		err = EIO;
	nc_error(c, qp, op, strerror(err), err, 0);
}

static enum ibv_mtu mtu_enum(unsigned bytes)
{
	switch (bytes) {
	case 256: return IBV_MTU_256;
	case 512: return IBV_MTU_512;
	case 2048: return IBV_MTU_2048;
	case 4096: return IBV_MTU_4096;
	default: return IBV_MTU_1024;
	}
}

static struct ibv_context *open_dev(struct nc_ctx *c)
{
	int n = 0;
	struct ibv_device **list = ibv_get_device_list(&n);
	struct ibv_context *ctx = NULL;
	if (!list) {
		verb_fail(c, -1, "ibv_get_device_list", errno);
		return NULL;
	}
	for (int i = 0; i < n; i++) {
		const char *name = ibv_get_device_name(list[i]);
		if (c->o->dev && strcmp(name, c->o->dev))
			continue;
		snprintf(c->dev_name, sizeof(c->dev_name), "%s", name);
		ctx = ibv_open_device(list[i]);
		if (!ctx)
			verb_fail(c, -1, "ibv_open_device", errno);
		break;
	}
	if (!ctx && !c->fatal)
		nc_error(c, -1, "ibv_get_device_list",
		         c->o->dev ? "device not found" : "no RDMA device", ENODEV, 0);
	ibv_free_device_list(list);
	return ctx;
}

static unsigned umin(unsigned a, unsigned b) { return a < b ? a : b; }

/* Queue depths: enough for every slot's message in flight plus the control
 * writes, capped by the device; a message's WR chain must fit in half the SQ
 * (see the signalling rule in traffic.c). */
static int size_queues(struct nc_ctx *c)
{
	const struct nc_opts *o = c->o;
	unsigned per_msg = o->mode == NC_SEND ? 1 : c->nchunks;
	uint64_t want = (uint64_t)per_msg * o->slots + 2ull * o->slots + 8;
	unsigned devmax = umin((unsigned)c->dev_attr.max_qp_wr, NC_FIFO_MAX);
	c->sq_depth = (unsigned)(want < devmax ? want : devmax);
	if (c->sq_depth < 2 * per_msg + 4) {
		char m[96];
		snprintf(m, sizeof(m), "a message needs %u WRs, device allows %u: raise -c",
		         per_msg, c->sq_depth);
		nc_error(c, -1, "sizing", m, EINVAL, 0);
		return -1;
	}
	/* Send mode: one receive per ring slot; write mode: as many (bufferless)
	 * receives as notifications can be in flight. */
	c->rq_depth = umin(o->mode == NC_READ ? 1 : o->slots, devmax);
	uint64_t unit = o->mode == NC_SEND ? o->msg_size : o->chunk_size;
	if (c->port_attr.max_msg_sz && unit > c->port_attr.max_msg_sz) {
		char m[96];
		snprintf(m, sizeof(m), "%s of %llu bytes exceeds the port's max_msg_sz %u",
		         o->mode == NC_SEND ? "message" : "chunk",
		         (unsigned long long)unit, c->port_attr.max_msg_sz);
		nc_error(c, -1, "sizing", m, EINVAL, 0);
		return -1;
	}
	uint64_t cqe = (uint64_t)o->qps * (c->sq_depth + c->rq_depth) + 16;
	unsigned cqmax = (unsigned)c->dev_attr.max_cqe;
	c->cq_size = (unsigned)(cqe < cqmax ? cqe : cqmax);
	c->max_rd = umin((unsigned)c->dev_attr.max_qp_rd_atom, 16);
	if (c->max_rd == 0)
		c->max_rd = 1;
	return 0;
}

/* ch's buffer registered (for the peer's writes and reads) into *mr: 0, or
 * -1 (logged) */
static int reg_buf(struct nc_ctx *c, struct nc_chan *ch, struct ibv_mr **mr)
{
	*mr = ibv_reg_mr(c->pd, ch->buf, ch->buflen,
	                 IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
	                 IBV_ACCESS_REMOTE_READ);
	if (!*mr) {
		verb_fail(c, (int)ch->idx, "ibv_reg_mr", errno);
		return -1;
	}
	return 0;
}

static int open_chan(struct nc_ctx *c, struct nc_chan *ch)
{
	const struct nc_opts *o = c->o;
	size_t ring = (size_t)o->msg_size * o->slots;
	ch->buflen = 2 * ring + sizeof(struct nc_ctrl);
	if (posix_memalign((void **)&ch->buf, 4096, ch->buflen)) {
		verb_fail(c, (int)ch->idx, "posix_memalign", ENOMEM);
		return -1;
	}
	memset(ch->buf, 0, ch->buflen);
	ch->tx_ring = ch->buf;
	ch->rx_ring = ch->buf + ring;
	ch->ctrl = (struct nc_ctrl *)(ch->buf + 2 * ring);
	ch->ctrl->credit = check_counter_encode(0);
	ch->ctrl->ready = check_counter_encode(0);

	ch->sig_fifo = calloc(c->sq_depth, sizeof(*ch->sig_fifo));
	if (!ch->sig_fifo) {
		verb_fail(c, (int)ch->idx, "calloc", ENOMEM);
		return -1;
	}
	if (reg_buf(c, ch, &ch->mr) ||
	    (c->o->mr2_at > 0 && c->o->mr2_reg_at <= 0 && nc_reg_mr2(c, ch)))
		return -1;
	struct ibv_qp_init_attr qa = {
		.send_cq = c->cq, .recv_cq = c->cq, .qp_type = IBV_QPT_RC,
		.sq_sig_all = 0,
		.cap = {.max_send_wr = c->sq_depth, .max_recv_wr = c->rq_depth,
		        .max_send_sge = 1, .max_recv_sge = 1,
		        .max_inline_data = 64},
	};
	ch->qp = ibv_create_qp(c->pd, &qa);
	if (!ch->qp) {
		verb_fail(c, (int)ch->idx, "ibv_create_qp", errno);
		return -1;
	}
	if (qa.cap.max_inline_data < sizeof(uint64_t)) {
		nc_error(c, (int)ch->idx, "ibv_create_qp", "no inline data support",
		         EOPNOTSUPP, 0);
		return -1;
	}
	ch->psn = (uint32_t)lrand48() & 0xffffff;
	return 0;
}

int nc_rdma_open(struct nc_ctx *c)
{
	const struct nc_opts *o = c->o;
	c->nchunks = (unsigned)((o->msg_size + o->chunk_size - 1) / o->chunk_size);
	srand48((long)getpid() ^ (long)(nc_now() * 1e6));

	c->ctx = open_dev(c);
	if (!c->ctx)
		return -1;
	int rc = ibv_query_device(c->ctx, &c->dev_attr);
	if (rc)
		return verb_fail(c, -1, "ibv_query_device", rc), -1;
	rc = ibv_query_port(c->ctx, (uint8_t)o->ib_port, &c->port_attr);
	if (rc)
		return verb_fail(c, -1, "ibv_query_port", rc), -1;
	if (ibv_query_gid(c->ctx, (uint8_t)o->ib_port, o->gid_idx, &c->gid))
		return verb_fail(c, -1, "ibv_query_gid", errno), -1;
	static const uint8_t zero[16];
	if (!memcmp(c->gid.raw, zero, 16)) {
		nc_error(c, -1, "ibv_query_gid", "GID index is empty (try -g 1)",
		         EINVAL, 0);
		return -1;
	}
	c->mtu = mtu_enum(o->mtu);
	if (c->port_attr.active_mtu && c->mtu > c->port_attr.active_mtu)
		c->mtu = c->port_attr.active_mtu;
	if (size_queues(c))
		return -1;

	c->pd = ibv_alloc_pd(c->ctx);
	if (!c->pd)
		return verb_fail(c, -1, "ibv_alloc_pd", errno), -1;
	c->cq = ibv_create_cq(c->ctx, (int)c->cq_size, NULL, NULL, 0);
	if (!c->cq)
		return verb_fail(c, -1, "ibv_create_cq", errno), -1;
	c->ch = calloc(o->qps, sizeof(*c->ch));
	if (!c->ch)
		return verb_fail(c, -1, "calloc", ENOMEM), -1;
	for (unsigned i = 0; i < o->qps; i++) {
		c->ch[i].idx = i;
		if (open_chan(c, &c->ch[i]))
			return -1;
	}
	return 0;
}

int nc_reg_mr2(struct nc_ctx *c, struct nc_chan *ch)
{
	return reg_buf(c, ch, &ch->mr2);
}

void nc_remote_pack(const struct nc_ctx *c, const struct nc_chan *ch, uint64_t *w)
{
	uint64_t g[2];
	memcpy(g, c->gid.raw, 16);
	w[0] = ch->qp->qp_num;
	w[1] = ch->psn;
	w[2] = c->port_attr.lid;
	w[3] = g[0];
	w[4] = g[1];
	w[5] = ch->mr->rkey;
	w[6] = (uintptr_t)ch->tx_ring;
	w[7] = (uintptr_t)ch->rx_ring;
	w[8] = (uintptr_t)&ch->ctrl->credit;
	w[9] = (uintptr_t)&ch->ctrl->ready;
	w[10] = ch->mr2 ? ch->mr2->rkey : ch->mr->rkey;
}

void nc_remote_unpack(struct nc_remote *r, const uint64_t *w)
{
	uint64_t g[2] = {w[3], w[4]};
	r->qpn = (uint32_t)w[0];
	r->psn = (uint32_t)w[1];
	r->lid = (uint32_t)w[2];
	memcpy(r->gid, g, 16);
	r->rkey = (uint32_t)w[5];
	r->tx_ring = w[6];
	r->rx_ring = w[7];
	r->credit = w[8];
	r->ready = w[9];
	r->rkey2 = (uint32_t)w[10];
	r->rkey2_known = w[10] != w[5]; /* (else registered later: --mr2-reg-at) */
}

static int qp_to_rts(struct nc_ctx *c, struct nc_chan *ch)
{
	const struct nc_opts *o = c->o;
	struct ibv_qp_attr a = {
		.qp_state = IBV_QPS_INIT, .pkey_index = 0,
		.port_num = (uint8_t)o->ib_port,
		.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
		                   IBV_ACCESS_REMOTE_READ,
	};
	int rc = ibv_modify_qp(ch->qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX |
	                                   IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
	if (rc)
		return verb_fail(c, (int)ch->idx, "ibv_modify_qp(INIT)", rc), -1;

	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = c->mtu;
	a.dest_qp_num = ch->rem.qpn;
	a.rq_psn = ch->rem.psn;
	a.max_dest_rd_atomic = (uint8_t)c->max_rd;
	a.min_rnr_timer = 12;
	a.ah_attr.dlid = (uint16_t)ch->rem.lid;
	a.ah_attr.port_num = (uint8_t)o->ib_port;
	a.ah_attr.is_global = 1;
	memcpy(a.ah_attr.grh.dgid.raw, ch->rem.gid, 16);
	a.ah_attr.grh.sgid_index = (uint8_t)o->gid_idx;
	a.ah_attr.grh.hop_limit = 64;
	rc = ibv_modify_qp(ch->qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU |
	                               IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
	                               IBV_QP_MAX_DEST_RD_ATOMIC |
	                               IBV_QP_MIN_RNR_TIMER);
	if (rc)
		return verb_fail(c, (int)ch->idx, "ibv_modify_qp(RTR)", rc), -1;

	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTS;
	a.timeout = (uint8_t)o->timeout;
	a.retry_cnt = 7;
	a.rnr_retry = 7;
	a.sq_psn = ch->psn;
	a.max_rd_atomic = (uint8_t)c->max_rd;
	rc = ibv_modify_qp(ch->qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT |
	                               IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
	                               IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC);
	if (rc)
		return verb_fail(c, (int)ch->idx, "ibv_modify_qp(RTS)", rc), -1;
	return 0;
}

int nc_rdma_connect(struct nc_ctx *c)
{
	for (unsigned i = 0; i < c->o->qps; i++)
		if (qp_to_rts(c, &c->ch[i]))
			return -1;
	return 0;
}

/* Releases the verbs objects and buffers; the channels themselves stay:
 * their accountants (rx_acc, tx_acc) are the verdict the report is written
 * from after the teardown (nc_rdma_free_channels frees them). */
void nc_rdma_close(struct nc_ctx *c)
{
	if (c->ch) {
		for (unsigned i = 0; i < c->o->qps; i++) {
			struct nc_chan *ch = &c->ch[i];
			if (ch->qp && ibv_destroy_qp(ch->qp))
				nc_log("qp %u: ibv_destroy_qp failed", i);
			if (ch->mr && ibv_dereg_mr(ch->mr))
				nc_log("qp %u: ibv_dereg_mr failed", i);
			if (ch->mr2 && ibv_dereg_mr(ch->mr2))
				nc_log("qp %u: ibv_dereg_mr failed", i);
			free(ch->sig_fifo);
			free(ch->buf);
			ch->qp = NULL;
			ch->mr = NULL;
			ch->sig_fifo = NULL;
			ch->buf = NULL;
		}
	}
	if (c->cq && ibv_destroy_cq(c->cq))
		nc_log("ibv_destroy_cq failed");
	if (c->pd && ibv_dealloc_pd(c->pd))
		nc_log("ibv_dealloc_pd failed");
	if (c->ctx && ibv_close_device(c->ctx))
		nc_log("ibv_close_device failed");
	c->cq = NULL;
	c->pd = NULL;
	c->ctx = NULL;
}

void nc_rdma_free_channels(struct nc_ctx *c)
{
	free(c->ch);
	c->ch = NULL;
}
