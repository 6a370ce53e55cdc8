/*
 * A plugin-style module for qp_loader: linked against libibverbs.so.1 like
 * UCX's libuct_ib or a pyverbs extension (NEEDED, no RUNPATH), it connects
 * one RC QP on DEV_A to one on DEV_B through the public verbs API and keeps
 * them, so that shiftctl status can show whether SHIFT protects them.
 */
#include <infiniband/verbs.h>
#include <stdio.h>
#include <string.h>

int qpmod_connect(const char *dev_a, const char *dev_b);

struct end {
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_qp *qp;
	union ibv_gid gid;
};

static int open_end(struct ibv_device **list, int n, const char *name, struct end *e)
{
	struct ibv_qp_init_attr ia = { .qp_type = IBV_QPT_RC,
				       .cap = { 16, 16, 1, 1, 0 } };

	for (int i = 0; i < n && !e->ctx; i++)
		if (!strcmp(ibv_get_device_name(list[i]), name))
			e->ctx = ibv_open_device(list[i]);
	if (!e->ctx || !(e->pd = ibv_alloc_pd(e->ctx)) ||
	    !(e->cq = ibv_create_cq(e->ctx, 32, NULL, NULL, 0)))
		return -1;
	ia.send_cq = ia.recv_cq = e->cq;
	e->qp = ibv_create_qp(e->pd, &ia);
	return e->qp && !ibv_query_gid(e->ctx, 1, 0, &e->gid) ? 0 : -1;
}

static int connect_end(struct end *e, const struct end *peer)
{
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .port_num = 1,
				 .qp_access_flags = IBV_ACCESS_REMOTE_WRITE };

	if (ibv_modify_qp(e->qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
			  IBV_QP_ACCESS_FLAGS))
		return -1;
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = IBV_MTU_1024;
	a.dest_qp_num = peer->qp->qp_num;
	a.rq_psn = 1;
	a.max_dest_rd_atomic = 1;
	a.min_rnr_timer = 12;
	a.ah_attr.is_global = 1;
	a.ah_attr.grh.dgid = peer->gid;
	a.ah_attr.grh.hop_limit = 1;
	a.ah_attr.port_num = 1;
	if (ibv_modify_qp(e->qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU |
			  IBV_QP_DEST_QPN | IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
			  IBV_QP_MIN_RNR_TIMER))
		return -1;
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTS;
	a.timeout = 14;
	a.retry_cnt = 7;
	a.rnr_retry = 7;
	a.sq_psn = 1;
	a.max_rd_atomic = 1;
	return ibv_modify_qp(e->qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
			     IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC);
}

/* 0 once both QPs are RTS (they stay, as a transport's would). */
int qpmod_connect(const char *dev_a, const char *dev_b)
{
	static struct end ends[16][2];
	static int used;
	struct end *a, *b;
	int n = 0, rc = -1;
	struct ibv_device **list = ibv_get_device_list(&n);

	if (!list || used >= 16) {
		fprintf(stderr, "qpmod: no device list\n");
		return -1;
	}
	a = &ends[used][0];
	b = &ends[used++][1];
	if (!open_end(list, n, dev_a, a) && !open_end(list, n, dev_b, b) &&
	    !connect_end(a, b) && !connect_end(b, a))
		rc = 0;
	else
		fprintf(stderr, "qpmod: cannot connect %s to %s\n", dev_a, dev_b);
	ibv_free_device_list(list);
	return rc;
}
