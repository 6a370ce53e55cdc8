/*
 * Default-state data-path cost, in instructions: what SHIFT adds to one
 * ibv_post_send (one SGE), one ibv_post_recv (one SGE) and one ibv_poll_cq
 * call that returns one completion, on the simulated RNIC.
 *
 * Run it under callgrind (tests/bench/callgrind.sh does): only the measured
 * verb calls are collected (CALLGRIND_TOGGLE_COLLECT around each), so the
 * total Ir divided by the iteration count is the cost of one call, all the
 * way down through the simulated provider. Run once with --plain and once
 * through SHIFT; the difference is SHIFT's.
 * The extended verbs the same way: expost is one ibv_wr_start,
 * ibv_wr_rdma_write, ibv_wr_set_sge, ibv_wr_complete batch (one WR), and
 * expoll one ibv_start_poll .. ibv_end_poll session returning one
 * completion (with its QP number read), on an ibv_create_qp_ex QP and an
 * ibv_create_cq_ex CQ.
 * NCCL's shapes: recv0 is a post_recv with num_sge = 0, chainN (N = 2, 4,
 * 8) one post_send of a chain of N one-SGE WRs (the script divides by N),
 * inline32 a 32-byte IBV_SEND_INLINE send, pollN (N = 2, 4) one
 * ibv_poll_cq(cq, 4, wc) call returning N completions; sge4 a WRITE of 4
 * SGEs, recv4 a receive of 4 SGEs.
 * --native measures SHIFT with native WQE access (the simulator's mlx5
 * mode), --plain-mlx5 its baseline.
 * Usage: shift-bench-datapath --plain|--shift|--plain-mlx5|--native
 *        send|recv|poll|expost|expoll|recv0|recv4|chain2|chain4|chain8|inline32|sge4|
 *        poll2|poll4
 *        [ITERATIONS]
 */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <valgrind/callgrind.h>

#include "kv/kv.h"
#include "shift/base/config.h"
#include "shift/dp/ctx.h"
#include "shift/shadow/shadow.h"
#include "shift/shift.h"
#include "shift_inline.h"
#include "sim.h"
#include "ep.h"

/* verbs.h's inline fallbacks name this; the simulator never takes it. */
int (ibv_query_port)(struct ibv_context *c, uint8_t p, struct _compat_ibv_port_attr *a)
{
	(void)c; (void)p; (void)a;
	abort();
}

#define ACCESS (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ)

static void drain(struct sim_world *w, struct ibv_cq *cq)
{
	struct ibv_wc wc;

	sim_world_run_until_idle(w);
	while (ibv_poll_cq(cq, 1, &wc) > 0)
		;
}

/* One iteration of an NCCL shape (see the header); returns 1 on success. */
static int nccl_shape(const char *op, long i, struct sim_world *w, struct sim_ep *a,
		      struct sim_ep *b, struct ibv_send_wr *tmpl)
{
	struct ibv_send_wr wrs[8], *bad;
	struct ibv_recv_wr *rbad;
	struct ibv_wc wc[4];
	int rc, n = 1;

	if (!strcmp(op, "recv0") || !strcmp(op, "recv4")) {
		struct ibv_sge rs[4];
		struct ibv_recv_wr r = { .wr_id = (uint64_t)i, .sg_list = rs,
					 .num_sge = op[4] - '0' };

		for (int k = 0; k < 4; k++)
			rs[k] = (struct ibv_sge){ .addr = (uintptr_t)b->buf + 16 * k, .length = 16,
						  .lkey = b->mr->lkey };

		CALLGRIND_TOGGLE_COLLECT;
		rc = ibv_post_recv(b->qp, &r, &rbad);
		CALLGRIND_TOGGLE_COLLECT;
		if (i % 32 == 31)
			for (int k = 0; k < 32; k++) {
				struct ibv_send_wr s = { .opcode = IBV_WR_SEND,
							 .send_flags = IBV_SEND_SIGNALED };

				ibv_post_send(a->qp, &s, &bad);
				drain(w, a->cq);
				drain(w, b->cq);
			}
		return rc == 0;
	}
	if (!strncmp(op, "chain", 5) || !strcmp(op, "inline32")) {
		char payload[32] = { 0 };
		struct ibv_sge isge = { .addr = (uintptr_t)payload, .length = 32 };

		n = op[0] == 'c' ? atoi(op + 5) : 1;
		if (n < 1 || n > 8)
			return 0;
		for (int k = 0; k < n; k++) {
			wrs[k] = *tmpl;
			wrs[k].wr_id = (uint64_t)i * 8 + (uint64_t)k;
			wrs[k].next = k + 1 < n ? &wrs[k + 1] : NULL;
		}
		if (op[0] == 'i') {
			wrs[0].sg_list = &isge;
			wrs[0].send_flags |= IBV_SEND_INLINE;
		}
		CALLGRIND_TOGGLE_COLLECT;
		rc = ibv_post_send(a->qp, wrs, &bad);
		CALLGRIND_TOGGLE_COLLECT;
		drain(w, a->cq);
		return rc == 0;
	}
	if (!strcmp(op, "sge4")) {
		struct ibv_sge ss[4];

		for (int k = 0; k < 4; k++)
			ss[k] = (struct ibv_sge){ .addr = (uintptr_t)a->buf + 16 * k, .length = 16,
						  .lkey = a->mr->lkey };
		wrs[0] = *tmpl;
		wrs[0].wr_id = (uint64_t)i;
		wrs[0].sg_list = ss;
		wrs[0].num_sge = 4;
		CALLGRIND_TOGGLE_COLLECT;
		rc = ibv_post_send(a->qp, wrs, &bad);
		CALLGRIND_TOGGLE_COLLECT;
		drain(w, a->cq);
		return rc == 0;
	}
	if (!strcmp(op, "poll2") || !strcmp(op, "poll4")) {
		n = op[4] - '0';
		for (int k = 0; k < n; k++)
			ibv_post_send(a->qp, tmpl, &bad);
		sim_world_run_until_idle(w);
		CALLGRIND_TOGGLE_COLLECT;
		rc = ibv_poll_cq(a->cq, 4, wc);
		CALLGRIND_TOGGLE_COLLECT;
		return rc == n && wc[0].status == IBV_WC_SUCCESS;
	}
	return 0;
}

int main(int argc, char **argv)
{
	if (argc < 3) {
		fprintf(stderr, "usage: %s --plain|--shift|--plain-mlx5|--native send|recv|poll|expost|expoll|recv0|chainN|inline32|pollN [ITERATIONS]\n",
			argv[0]);
		return 2;
	}
	/* --native: SHIFT on the simulator's mlx5 mode (native WQE access);
	 * --plain-mlx5: its baseline, the same provider work without SHIFT */
	int native = !strcmp(argv[1], "--native");
	int shift = native || !strcmp(argv[1], "--shift");
	const char *op = argv[2];
	long iters = argc > 3 ? atol(argv[3]) : 2000;
	struct sim_world_opts wo = { .mlx5 = native || !strcmp(argv[1], "--plain-mlx5") };
	struct sim_world *w = sim_world_create(&wo);
	struct sim_host *h0 = sim_host_create(w, 2), *h1 = sim_host_create(w, 2);
	const struct shift_lower *va = sim_lower(h0), *vb = sim_lower(h1);
	struct ibv_qp_cap cap = { .max_send_wr = 64, .max_recv_wr = 64,
				  .max_send_sge = strcmp(op, "sge4") ? 1 : 4,
				  .max_recv_sge = strcmp(op, "recv4") ? 1 : 4,
				  .max_inline_data = strcmp(op, "inline32") ? 0 : 32 };
	struct sim_ep a, b;
	struct sim_ep_info ia, ib;

	if (shift) {
		shift_lower_set(sim_lower_world(w));
		setenv("SHIFT_KV_URL", "mem://bench", 1);
		setenv("SHIFT_STATUS_DIR", "", 1);
		shift_inline_load();
		va = vb = &shift_verbs;
	}
	unsigned flags = !strncmp(op, "ex", 2) ? SIM_EP_EX : 0;

	if (sim_ep_open(&a, va, "sim0_0", 4096, ACCESS, &cap, 256, flags) ||
	    sim_ep_open(&b, vb, "sim1_0", 4096, ACCESS, &cap, 256, flags)) {
		fprintf(stderr, "setup failed\n");
		return 1;
	}
	sim_ep_info(&a, 1, &ia);
	sim_ep_info(&b, 2, &ib);
	if (sim_ep_connect(&a, &ia, &ib, NULL) || sim_ep_connect(&b, &ib, &ia, NULL))
		return 1;
	for (int i = 0; shift && i < 4; i++)
		shift_rnic_pass_all();
	if (shift) {
		struct shift_qp_info qi;

		if (shift_shadow_qp_info(a.qp, &qi) || qi.state != SHIFT_SHADOW_READY) {
			fprintf(stderr, "the QP is not shadowed: measuring the wrong path\n");
			return 1;
		}
		if (!shift_dqp_of_qp(a.qp) || !shift_dqp_of_qp(a.qp)->nwq != !native) {
			fprintf(stderr, "the QP is not on the %s path\n", native ? "native" : "mirror");
			return 1;
		}
	}

	struct ibv_sge sge = { .addr = (uintptr_t)a.buf, .length = 64, .lkey = a.mr->lkey };
	struct ibv_send_wr wr = {
		.sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_RDMA_WRITE,
		.send_flags = IBV_SEND_SIGNALED,
		.wr.rdma = { .remote_addr = (uintptr_t)b.buf, .rkey = b.mr->rkey },
	}, *bad;
	struct ibv_sge rsge = { .addr = (uintptr_t)b.buf, .length = 64, .lkey = b.mr->lkey };
	struct ibv_recv_wr rwr = { .sg_list = &rsge, .num_sge = 1 }, *rbad;
	struct ibv_wc wc;
	long ok = 0;

	for (long i = 0; i < iters; i++) {
		wr.wr_id = (uint64_t)i;
		rwr.wr_id = (uint64_t)i;
		if (!strcmp(op, "send")) {
			CALLGRIND_TOGGLE_COLLECT;
			int rc = ibv_post_send(a.qp, &wr, &bad);
			CALLGRIND_TOGGLE_COLLECT;
			ok += rc == 0;
			sim_world_run_until_idle(w);
			while (ibv_poll_cq(a.cq, 1, &wc) > 0)
				;
		} else if (!strcmp(op, "recv")) {
			CALLGRIND_TOGGLE_COLLECT;
			int rc = ibv_post_recv(b.qp, &rwr, &rbad);
			CALLGRIND_TOGGLE_COLLECT;
			ok += rc == 0;
			if (i % 32 == 31) {
				/* consume them: sends from a */
				struct ibv_send_wr s = { .opcode = IBV_WR_SEND, .sg_list = &sge,
							 .num_sge = 1, .send_flags = IBV_SEND_SIGNALED };
				for (int k = 0; k < 32; k++) {
					ibv_post_send(a.qp, &s, &bad);
					sim_world_run_until_idle(w);
					while (ibv_poll_cq(a.cq, 1, &wc) > 0)
						;
					while (ibv_poll_cq(b.cq, 1, &wc) > 0)
						;
				}
			}
		} else if (strcmp(op, "poll") && strcmp(op, "expoll") &&
			   strncmp(op, "ex", 2)) {
			ok += nccl_shape(op, i, w, &a, &b, &wr);
		} else if (!strcmp(op, "expost")) {
			struct ibv_qp_ex *q = a.qpx;

			CALLGRIND_TOGGLE_COLLECT;
			ibv_wr_start(q);
			q->wr_id = (uint64_t)i;
			q->wr_flags = IBV_SEND_SIGNALED;
			ibv_wr_rdma_write(q, b.mr->rkey, (uintptr_t)b.buf);
			ibv_wr_set_sge(q, sge.lkey, sge.addr, sge.length);
			int rc = ibv_wr_complete(q);
			CALLGRIND_TOGGLE_COLLECT;
			ok += rc == 0;
			sim_world_run_until_idle(w);
			while (ibv_poll_cq(a.cq, 1, &wc) > 0)
				;
		} else if (!strcmp(op, "expoll")) {
			struct ibv_poll_cq_attr attr = { .comp_mask = 0 };

			ibv_post_send(a.qp, &wr, &bad);
			sim_world_run_until_idle(w);
			CALLGRIND_TOGGLE_COLLECT;
			int rc = ibv_start_poll(a.cqx, &attr);
			uint32_t qpn = rc ? 0 : ibv_wc_read_qp_num(a.cqx);
			bool good = !rc && a.cqx->status == IBV_WC_SUCCESS && a.cqx->wr_id == (uint64_t)i;

			if (!rc)
				ibv_end_poll(a.cqx);
			CALLGRIND_TOGGLE_COLLECT;
			ok += good && qpn == a.qp->qp_num;
		} else {
			ibv_post_send(a.qp, &wr, &bad);
			sim_world_run_until_idle(w);
			CALLGRIND_TOGGLE_COLLECT;
			int n = ibv_poll_cq(a.cq, 1, &wc);
			CALLGRIND_TOGGLE_COLLECT;
			ok += n == 1 && wc.status == IBV_WC_SUCCESS;
		}
	}
	printf("%s %s: %ld of %ld calls succeeded\n", shift ? "shift" : "plain", op, ok, iters);
	return ok == iters ? 0 : 1;
}
