/*
 * Cost of ibv_modify_qp to RTR and to RTS, on a real device: N RC QPs on
 * one device connected in pairs to each other (loopback), timed per
 * transition. Run it with the plain library and through SHIFT
 * (tests/bench/modify_qp.sh alternates both and prints the ratio).
 * Usage: shift-bench-modify-qp DEVICE [GID_INDEX [NQP]]
 * Prints: "setup_us=<mean> setup_cpu_us=<mean>" (a QP created, taken to
 * INIT, RTR and RTS: the sum of the steps' means), "rtr_us=<mean>
 * rts_us=<mean> rtr_cpu_us=<mean> rts_cpu_us=<mean>" and those four as
 * medians ("rtr_med_us=" ...): wall clock, and the
 * CPU time of the calling thread alone (SHIFT's
 * background thread replays each transition on the backup QP; on a
 * one-CPU guest it runs inside the wall-clock interval, preempting the
 * application, where a host with more CPUs runs it beside). The median
 * leaves out what only the first calls pay: under QEMU/TCG, translating
 * code run for the first time costs tens of microseconds a block, which
 * a mean over 64 calls spreads over every call (SHIFT runs more code than
 * plain, so its mean pays more of that than a native CPU would).
 */
#include <infiniband/verbs.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double clock_us(clockid_t c)
{
	struct timespec ts;

	clock_gettime(c, &ts);
	return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

/* (wall, thread CPU) at the start of a call; add the call's to *wall, *cpu */
struct span {
	double wall, cpu;
};

static struct span span_start(void)
{
	return (struct span){ clock_us(CLOCK_MONOTONIC), clock_us(CLOCK_THREAD_CPUTIME_ID) };
}

/* The call's wall and CPU time into wall[i], cpu[i] */
static void span_end(struct span t, double *wall, double *cpu, int i)
{
	wall[i] = clock_us(CLOCK_MONOTONIC) - t.wall;
	cpu[i] = clock_us(CLOCK_THREAD_CPUTIME_ID) - t.cpu;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return (x > y) - (x < y);
}

static double mean(const double *v, int n)
{
	double sum = 0;

	for (int i = 0; i < n; i++)
		sum += v[i];
	return sum / n;
}

/* (sorts v) */
static double median(double *v, int n)
{
	qsort(v, (size_t)n, sizeof(*v), cmp_double);
	return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

int main(int argc, char **argv)
{
	const char *dev = argc > 1 ? argv[1] : "rxe0";
	int gidx = argc > 2 ? atoi(argv[2]) : 1;
	int n = argc > 3 ? atoi(argv[3]) : 64;
	struct ibv_device **list = ibv_get_device_list(NULL);
	struct ibv_context *ctx = NULL;

	for (int i = 0; list && list[i]; i++)
		if (!strcmp(ibv_get_device_name(list[i]), dev))
			ctx = ibv_open_device(list[i]);
	if (!ctx) {
		fprintf(stderr, "cannot open %s\n", dev);
		return 1;
	}
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	struct ibv_cq *cq = ibv_create_cq(ctx, 64, NULL, NULL, 0);
	struct ibv_qp **qp = calloc((size_t)n, sizeof(*qp));
	union ibv_gid gid;
	/* per QP: RTR wall, RTS wall, RTR CPU, RTS CPU, create + INIT wall,
	 * create + INIT CPU */
	double *v[6];
	bool nomem = false;

	for (int k = 0; k < 6; k++)
		nomem |= !(v[k] = calloc((size_t)n, sizeof(double)));
	if (!pd || !cq || !qp || nomem || n < 1 || ibv_query_gid(ctx, 1, gidx, &gid))
		return 1;
	for (int i = 0; i < n; i++) {
		struct ibv_qp_init_attr ia = { .send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
			.cap = { .max_send_wr = 16, .max_recv_wr = 16, .max_send_sge = 1, .max_recv_sge = 1 } };
		struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .port_num = 1,
			.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ };

		struct span t = span_start();

		qp[i] = ibv_create_qp(pd, &ia);
		if (!qp[i] || ibv_modify_qp(qp[i], &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX |
					    IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
			return 1;
		span_end(t, v[4], v[5], i);
	}
	for (int i = 0; i < n; i++) {
		struct ibv_qp_attr a = { .qp_state = IBV_QPS_RTR, .path_mtu = IBV_MTU_1024,
			.dest_qp_num = qp[i ^ 1]->qp_num, .rq_psn = 0, .max_dest_rd_atomic = 1,
			.min_rnr_timer = 12,
			.ah_attr = { .is_global = 1, .port_num = 1,
				     .grh = { .dgid = gid, .sgid_index = (uint8_t)gidx, .hop_limit = 64 } } };
		struct span t = span_start();

		if (ibv_modify_qp(qp[i], &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU |
				  IBV_QP_DEST_QPN | IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
				  IBV_QP_MIN_RNR_TIMER))
			return 1;
		span_end(t, v[0], v[2], i);
	}
	for (int i = 0; i < n; i++) {
		struct ibv_qp_attr a = { .qp_state = IBV_QPS_RTS, .sq_psn = 0, .timeout = 14,
					 .retry_cnt = 7, .rnr_retry = 7, .max_rd_atomic = 1 };
		struct span t = span_start();

		if (ibv_modify_qp(qp[i], &a, IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT |
				  IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC))
			return 1;
		span_end(t, v[1], v[3], i);
	}
	/* created and connected: the four steps' means, per QP */
	printf("setup_us=%.2f setup_cpu_us=%.2f ", mean(v[4], n) + mean(v[0], n) + mean(v[1], n),
	       mean(v[5], n) + mean(v[2], n) + mean(v[3], n));
	printf("rtr_us=%.2f rts_us=%.2f rtr_cpu_us=%.2f rts_cpu_us=%.2f", mean(v[0], n),
	       mean(v[1], n), mean(v[2], n), mean(v[3], n));
	printf(" rtr_med_us=%.2f rts_med_us=%.2f rtr_cpu_med_us=%.2f rts_cpu_med_us=%.2f\n",
	       median(v[0], n), median(v[1], n), median(v[2], n), median(v[3], n));
	for (int k = 0; k < 6; k++)
		free(v[k]);
	for (int i = 0; i < n; i++)
		ibv_destroy_qp(qp[i]);
	free(qp);
	ibv_destroy_cq(cq);
	ibv_dealloc_pd(pd);
	ibv_close_device(ctx);
	ibv_free_device_list(list);
	return 0;
}
