/*
 * Data-path throughput on the simulated RNIC, in wall-clock operations per
 * second: the application's loop of posts, the simulated network's work and
 * its polls, plain or through SHIFT (Default state, no failure). One run is
 * one mode; tests/bench/throughput.sh runs the modes alternately and prints
 * the ratios (the machine's noise cancels out of a ratio taken in one run).
 *
 *   write     batches of 8 one-SGE 64-byte RDMA WRITEs, the last signaled
 *   sendrecv  batches of 8 receives, then 8 one-SGE 64-byte SENDs (all
 *             signaled), both sides polled
 *
 * --threads 2: two application threads, each with a QP pair of its own, on
 * the simulator made thread-safe (sim_locked.h: one lock around each of its
 * calls, in both modes), so SHIFT's own work runs outside that lock.
 * --idle-pairs (plain modes): one more connected QP pair per pair, idle,
 * on the second devices, as SHIFT's backup QPs are: the simulator's
 * scheduler looks at every QP of the world at each step, a host CPU cost
 * a real NIC's idle QPs do not have, so this baseline leaves it out of the
 * ratio (throughput.sh prints both).
 * Usage: shift-bench-throughput --plain|--shift|--plain-mlx5|--native
 *        write|sendrecv THREADS OPS_PER_THREAD [--idle-pairs]
 */
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kv/kv.h"
#include "shift/shadow/shadow.h"
#include "shift/shift.h"
#include "shift_inline.h"
#include "sim.h"
#include "sim_locked.h"
#include "ep.h"

/* verbs.h's inline fallbacks name this; the simulator never takes it. */
int (ibv_query_port)(struct ibv_context *c, uint8_t p, struct _compat_ibv_port_attr *a)
{
	(void)c; (void)p; (void)a;
	abort();
}

#define ACCESS (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ)
#define BATCH 8

static struct sim_world *world;
static bool locked, sendrecv;
static long ops;

struct pair {
	struct sim_ep a, b, ia, ib; /* (ia, ib: --idle-pairs) */
	pthread_t t;
	long done;
};

/* a and b opened on devices da and db and connected to each other */
static int connect_pair(struct sim_ep *a, struct sim_ep *b, const struct shift_lower *v,
			const char *da, const char *db, const struct ibv_qp_cap *cap)
{
	struct sim_ep_info ia, ib;

	if (sim_ep_open(a, v, da, 4096, ACCESS, cap, 256, 0) ||
	    sim_ep_open(b, v, db, 4096, ACCESS, cap, 256, 0))
		return -1;
	sim_ep_info(a, 1, &ia);
	sim_ep_info(b, 2, &ib);
	return sim_ep_connect(a, &ia, &ib, NULL) || sim_ep_connect(b, &ib, &ia, NULL) ? -1 : 0;
}

static void run_world(void)
{
	if (locked)
		sim_locked_enter();
	sim_world_run_until_idle(world);
	if (locked)
		sim_locked_leave();
}

/* n completions from cq (the world run until they came) */
static int reap(struct ibv_cq *cq, int n)
{
	struct ibv_wc wc[BATCH];

	for (int got = 0, tries = 0; got < n; tries++) {
		int k = ibv_poll_cq(cq, BATCH, wc);

		if (k < 0 || tries > 1000)
			return -1;
		for (int i = 0; i < k; i++)
			if (wc[i].status != IBV_WC_SUCCESS)
				return -1;
		got += k;
		if (got < n)
			run_world();
	}
	return 0;
}

static void *loop(void *arg)
{
	struct pair *p = arg;
	struct ibv_sge sge = { .addr = (uintptr_t)p->a.buf, .length = 64, .lkey = p->a.mr->lkey };
	struct ibv_sge rsge = { .addr = (uintptr_t)p->b.buf, .length = 64, .lkey = p->b.mr->lkey };
	struct ibv_send_wr wr = {
		.sg_list = &sge, .num_sge = 1,
		.opcode = sendrecv ? IBV_WR_SEND : IBV_WR_RDMA_WRITE,
		.wr.rdma = { .remote_addr = (uintptr_t)p->b.buf, .rkey = p->b.mr->rkey },
	}, *bad;
	struct ibv_recv_wr rwr = { .sg_list = &rsge, .num_sge = 1 }, *rbad;

	for (long i = 0; i < ops; i += BATCH) {
		for (int k = 0; k < BATCH && sendrecv; k++) {
			rwr.wr_id = (uint64_t)(i + k);
			if (ibv_post_recv(p->b.qp, &rwr, &rbad))
				return NULL;
		}
		for (int k = 0; k < BATCH; k++) {
			wr.wr_id = (uint64_t)(i + k);
			wr.send_flags = sendrecv || k == BATCH - 1 ? IBV_SEND_SIGNALED : 0;
			if (ibv_post_send(p->a.qp, &wr, &bad))
				return NULL;
		}
		run_world();
		if (reap(p->a.cq, sendrecv ? BATCH : 1) || (sendrecv && reap(p->b.cq, BATCH)))
			return NULL;
		p->done = i + BATCH;
	}
	return NULL;
}

int main(int argc, char **argv)
{
	if (argc != 5 && argc != 6) {
		fprintf(stderr, "usage: %s --plain|--shift|--plain-mlx5|--native write|sendrecv "
			"THREADS OPS_PER_THREAD [--idle-pairs]\n", argv[0]);
		return 2;
	}
	bool idle = argc == 6 && !strcmp(argv[5], "--idle-pairs");
	int native = !strcmp(argv[1], "--native");
	int shift = native || !strcmp(argv[1], "--shift");
	int nthreads = atoi(argv[3]);
	struct sim_world_opts wo = { .mlx5 = native || !strcmp(argv[1], "--plain-mlx5") };
	struct ibv_qp_cap cap = { .max_send_wr = 64, .max_recv_wr = 64, .max_send_sge = 1,
				  .max_recv_sge = 1 };
	struct pair pr[2];
	struct timespec t0, t1;
	const struct shift_lower *v;
	long total = 0;

	sendrecv = !strcmp(argv[2], "sendrecv");
	ops = atol(argv[4]);
	if (nthreads < 1 || nthreads > 2 || ops < BATCH)
		return 2;
	world = sim_world_create(&wo);
	sim_host_create(world, 2);
	sim_host_create(world, 2);
	locked = nthreads > 1;
	v = locked ? sim_locked_lower(world) : sim_lower_world(world);
	if (shift) {
		shift_lower_set(v);
		setenv("SHIFT_KV_URL", "mem://bench", 1);
		setenv("SHIFT_STATUS_DIR", "", 1);
		shift_inline_load();
		v = &shift_verbs;
	}
	memset(pr, 0, sizeof(pr));
	for (int i = 0; i < nthreads; i++) {
		if (connect_pair(&pr[i].a, &pr[i].b, v, "sim0_0", "sim1_0", &cap) ||
		    (idle && !shift &&
		     connect_pair(&pr[i].ia, &pr[i].ib, v, "sim0_1", "sim1_1", &cap)))
			return 1;
	}
	for (int i = 0; shift && i < 4; i++)
		shift_rnic_pass_all();
	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (int i = 0; i < nthreads; i++)
		pthread_create(&pr[i].t, NULL, loop, &pr[i]);
	for (int i = 0; i < nthreads; i++) {
		pthread_join(pr[i].t, NULL);
		total += pr[i].done;
	}
	clock_gettime(CLOCK_MONOTONIC, &t1);
	double s = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;

	if (total != ops * nthreads) {
		fprintf(stderr, "only %ld of %ld operations completed\n", total, ops * nthreads);
		return 1;
	}
	printf("ops_per_s %.0f\n", (double)total / s);
	return 0;
}
