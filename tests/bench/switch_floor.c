/*
 * The floor of a failover's switch on a real device: the verbs a switch
 * cannot do without, done by a plain application, timed step by step, so
 * that SHIFT's measured switch (its failover-timing line) can be read
 * against what the device and the host take for the same work.
 *
 * Two loopback QP pairs on one device or two: the "default" QP, connected
 * to a QP number that does not answer (its WRs stay outstanding, as behind
 * a dead NIC), and a live "backup" pair. Each round:
 *   post   NWR RDMA WRITEs of SIZE bytes and NWR receives on the default QP
 *   err    modify_qp(default, ERR)                    (SHIFT: stop_default)
 *   drain  poll its CQ until all 2 x NWR flushes are in        (the drain)
 *   recv   post NWR receives on the backup QP      (receives reposted first)
 *   msg    one WRITE_WITH_IMM on the backup QP, polled until it lands at
 *          the other end of the pair                (the handshake message)
 *   retx   the NWR WRITEs again on the backup, as chains of 64, the time in
 *          post_send alone (SHIFT: post_us)                    (reposting)
 *   done   polled until the last of them completes
 * A switch needs err + drain + recv + msg at each end (the peer's after
 * mine arrived) and then retx: "floor" prints that sum with both ends'
 * steps taken as this host's.
 *
 * Usage: shift-bench-switch-floor DEFAULT_DEV BACKUP_DEV [NWR [SIZE [ROUNDS [GID_INDEX]]]]
 * Prints one line per round and one of medians (microseconds):
 *   err= drain= recv= msg= retx= done= floor=
 */
#include <infiniband/verbs.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { STEPS = 7, CHAIN = 64 };
static const char *const step_name[STEPS] = { "err", "drain", "recv", "msg", "retx", "done", "floor" };

static double now_us(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return (x > y) - (x < y);
}

struct end {
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_mr *mr;
	char *buf;
	union ibv_gid gid;
};

static int die(const char *what)
{
	fprintf(stderr, "shift-bench-switch-floor: %s\n", what);
	exit(1);
}

static void open_end(struct end *e, const char *name, int gidx, size_t len, int cqe)
{
	struct ibv_device **list = ibv_get_device_list(NULL);

	for (int i = 0; list && list[i] && !e->ctx; i++)
		if (!strcmp(ibv_get_device_name(list[i]), name))
			e->ctx = ibv_open_device(list[i]);
	ibv_free_device_list(list);
	if (!e->ctx)
		die("cannot open the device");
	e->pd = ibv_alloc_pd(e->ctx);
	e->cq = e->pd ? ibv_create_cq(e->ctx, cqe, NULL, NULL, 0) : NULL;
	e->buf = calloc(1, len);
	e->mr = e->cq && e->buf ?
			ibv_reg_mr(e->pd, e->buf, len, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE) :
			NULL;
	if (!e->mr || ibv_query_gid(e->ctx, 1, gidx, &e->gid))
		die("cannot set the device up");
}

static struct ibv_qp *make_qp(struct end *e, uint32_t nwr)
{
	struct ibv_qp_init_attr ia = { .send_cq = e->cq, .recv_cq = e->cq, .qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = nwr + 1, .max_recv_wr = nwr + 1, .max_send_sge = 1,
			 .max_recv_sge = 1 } };
	struct ibv_qp *qp = ibv_create_qp(e->pd, &ia);
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .port_num = 1,
				 .qp_access_flags = IBV_ACCESS_REMOTE_WRITE };

	if (!qp || ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
				 IBV_QP_ACCESS_FLAGS))
		die("cannot create a QP");
	return qp;
}

/* INIT -> RTR -> RTS towards dest_qpn at gid; short timeouts, few retries
 * (the default QP's WRs need only stay outstanding while a round runs) */
static void connect_qp(struct ibv_qp *qp, uint32_t dest_qpn, const union ibv_gid *gid, int gidx)
{
	struct ibv_qp_attr r = { .qp_state = IBV_QPS_RTR, .path_mtu = IBV_MTU_1024,
		.dest_qp_num = dest_qpn, .max_dest_rd_atomic = 1, .min_rnr_timer = 1,
		.ah_attr = { .is_global = 1, .port_num = 1,
			     .grh = { .dgid = *gid, .sgid_index = (uint8_t)gidx, .hop_limit = 64 } } };
	struct ibv_qp_attr s = { .qp_state = IBV_QPS_RTS, .timeout = 14, .retry_cnt = 7,
				 .rnr_retry = 7, .max_rd_atomic = 1 };

	if (ibv_modify_qp(qp, &r, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
			  IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER) ||
	    ibv_modify_qp(qp, &s, IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT |
			  IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC))
		die("cannot connect a QP");
}

static void reset_qp(struct ibv_qp *qp)
{
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_RESET };
	struct ibv_qp_attr i = { .qp_state = IBV_QPS_INIT, .port_num = 1,
				 .qp_access_flags = IBV_ACCESS_REMOTE_WRITE };

	if (ibv_modify_qp(qp, &a, IBV_QP_STATE) ||
	    ibv_modify_qp(qp, &i, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
			  IBV_QP_ACCESS_FLAGS))
		die("cannot reset a QP");
}

static void post_recvs(struct ibv_qp *qp, struct end *e, uint32_t n)
{
	struct ibv_sge sg = { .addr = (uintptr_t)e->buf, .length = 0, .lkey = e->mr->lkey };
	struct ibv_recv_wr wr = { .wr_id = 1, .sg_list = &sg, .num_sge = 1 }, *bad;

	for (uint32_t i = 0; i < n; i++)
		if (ibv_post_recv(qp, &wr, &bad))
			die("post_recv failed");
}

/* n WRITEs of size bytes into the far end's buffer, as chains of CHAIN,
 * the last signaled; the time inside post_send */
static double post_writes(struct ibv_qp *qp, struct end *e, const struct end *far, uint32_t n,
			  uint32_t size)
{
	struct ibv_sge sg[CHAIN];
	struct ibv_send_wr wr[CHAIN], *bad;
	double in = 0;

	for (uint32_t i = 0; i < n;) {
		uint32_t k = n - i < CHAIN ? n - i : CHAIN;

		for (uint32_t j = 0; j < k; j++, i++) {
			sg[j] = (struct ibv_sge){ .addr = (uintptr_t)e->buf, .length = size,
						  .lkey = e->mr->lkey };
			wr[j] = (struct ibv_send_wr){ .wr_id = i, .sg_list = &sg[j], .num_sge = 1,
				.opcode = IBV_WR_RDMA_WRITE, .next = j + 1 < k ? &wr[j + 1] : NULL,
				.send_flags = i + 1 == n ? IBV_SEND_SIGNALED : 0,
				.wr = { .rdma = { .remote_addr = (uintptr_t)far->buf,
						  .rkey = far->mr->rkey } } };
		}
		double t = now_us();

		if (ibv_post_send(qp, wr, &bad))
			die("post_send failed");
		in += now_us() - t;
	}
	return in;
}

/* polled until want completions are in (any status); 0 on a timeout */
static int poll_n(struct ibv_cq *cq, int want, int expect_ok)
{
	struct ibv_wc wc[32];
	double until = now_us() + 30e6;

	while (want > 0) {
		int n = ibv_poll_cq(cq, 32, wc);

		if (n < 0 || now_us() > until)
			return 0;
		for (int i = 0; i < n; i++)
			if (expect_ok && wc[i].status != IBV_WC_SUCCESS)
				die("a backup WR failed");
		want -= n;
	}
	return 1;
}

int main(int argc, char **argv)
{
	if (argc < 3)
		die("usage: shift-bench-switch-floor DEFAULT_DEV BACKUP_DEV [NWR [SIZE [ROUNDS [GID_INDEX]]]]");
	uint32_t nwr = argc > 3 ? (uint32_t)atoi(argv[3]) : 128;
	uint32_t size = argc > 4 ? (uint32_t)atoi(argv[4]) : 65536;
	int rounds = argc > 5 ? atoi(argv[5]) : 9;
	int gidx = argc > 6 ? atoi(argv[6]) : 1;

	if (nwr < 1 || nwr > 4096 || size > (1u << 24) || rounds < 1 || rounds > 1000)
		die("NWR 1..4096, SIZE at most 16 MiB, ROUNDS 1..1000");
	struct end d = { 0 }, b = { 0 };

	open_end(&d, argv[1], gidx, size ? size : 1, (int)(4 * nwr + 8));
	open_end(&b, argv[2], gidx, size ? size : 1, (int)(4 * nwr + 8));
	struct ibv_qp *dq = make_qp(&d, nwr), *dq_peer = make_qp(&d, nwr);
	struct ibv_qp *bq = make_qp(&b, nwr), *bq_peer = make_qp(&b, nwr);
	double *v[STEPS];

	for (int k = 0; k < STEPS; k++)
		if (!(v[k] = calloc((size_t)rounds, sizeof(double))))
			die("out of memory");
	connect_qp(bq, bq_peer->qp_num, &b.gid, gidx);
	connect_qp(bq_peer, bq->qp_num, &b.gid, gidx);
	for (int r = 0; r < rounds; r++) {
		/* the default QP towards a QP that is not connected back: its
		 * writes are outstanding, unacknowledged (a dead path) */
		connect_qp(dq, dq_peer->qp_num ^ 0x800000u, &d.gid, gidx);
		post_recvs(dq, &d, nwr);
		post_writes(dq, &d, &d, nwr, size);
		/* (every WR outstanding, none acknowledged: the QP retries) */
		struct ibv_qp_attr err = { .qp_state = IBV_QPS_ERR };
		double t0 = now_us();

		if (ibv_modify_qp(dq, &err, IBV_QP_STATE))
			die("modify_qp ERR failed");
		double t1 = now_us();

		/* the sends' flushes (every WR completes once in ERR) and the
		 * receives' */
		if (!poll_n(d.cq, (int)(2 * nwr), 0))
			die("the default QP's flushes did not come");
		double t2 = now_us();

		post_recvs(bq_peer, &b, nwr + 1);
		double t3 = now_us();
		struct ibv_send_wr m = { .wr_id = 7, .opcode = IBV_WR_RDMA_WRITE_WITH_IMM,
					 .send_flags = IBV_SEND_SIGNALED, .imm_data = 1 }, *bad;

		if (ibv_post_send(bq, &m, &bad) || !poll_n(b.cq, 2, 1))
			die("the message did not land");
		double t4 = now_us();
		double in = post_writes(bq, &b, &b, nwr, size);
		double t5 = now_us();

		if (!poll_n(b.cq, 1, 1))
			die("the reposted writes did not complete");
		double t6 = now_us();

		v[0][r] = t1 - t0;
		v[1][r] = t2 - t1;
		v[2][r] = t3 - t2;
		v[3][r] = t4 - t3;
		v[4][r] = in;
		v[5][r] = t6 - t5 + (t5 - t4 - in);
		v[6][r] = 2 * (t4 - t0) + in;
		printf("round %d:", r);
		for (int k = 0; k < STEPS; k++)
			printf(" %s=%.0f", step_name[k], v[k][r]);
		printf("\n");
		/* (a reset drops the backup's receives left over) */
		reset_qp(dq);
		reset_qp(bq_peer);
		reset_qp(bq);
		connect_qp(bq, bq_peer->qp_num, &b.gid, gidx);
		connect_qp(bq_peer, bq->qp_num, &b.gid, gidx);
	}
	printf("median over %d rounds, NWR=%u SIZE=%u:", rounds, nwr, size);
	for (int k = 0; k < STEPS; k++) {
		qsort(v[k], (size_t)rounds, sizeof(double), cmp_double);
		printf(" %s=%.0f", step_name[k], v[k][rounds / 2]);
		free(v[k]);
	}
	printf("\n");
	return 0;
}
