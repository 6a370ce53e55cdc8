/*
 * Extended CQ polling (ibv_start_poll / ibv_next_poll / ibv_end_poll and
 * the ibv_wc_read_* accessors) over the simulated CQ ring. Every sim CQ is
 * an ibv_cq_ex, so CQs made by create_cq and by create_cq_ex can both be
 * polled either way. The current entry is copied out of the ring on
 * start/next, so end_poll has nothing to release.
 */
#include <errno.h>
#include <string.h>

#include "sim_int.h"

static struct sim_cq *to_cq(struct ibv_cq_ex *c) { return (struct sim_cq *)c; }

static int sim_cq_ex_next(struct ibv_cq_ex *c)
{
	struct ibv_wc wc;

	if (sim_poll_cq(ibv_cq_ex_to_cq(c), 1, &wc) != 1)
		return ENOENT;
	to_cq(c)->cur = wc;
	c->wr_id = wc.wr_id;
	c->status = wc.status;
	return 0;
}

static int sim_cq_ex_start(struct ibv_cq_ex *c, struct ibv_poll_cq_attr *attr)
{
	if (attr && attr->comp_mask)
		return EINVAL;
	to_cq(c)->polling = true;
	return sim_cq_ex_next(c);
}

static void sim_cq_ex_end(struct ibv_cq_ex *c)
{
	to_cq(c)->polling = false;
}

static enum ibv_wc_opcode rd_opcode(struct ibv_cq_ex *c)
{
	return to_cq(c)->cur.opcode;
}
static uint32_t rd_vendor_err(struct ibv_cq_ex *c) { return to_cq(c)->cur.vendor_err; }
static uint32_t rd_byte_len(struct ibv_cq_ex *c) { return to_cq(c)->cur.byte_len; }
static __be32 rd_imm(struct ibv_cq_ex *c) { return to_cq(c)->cur.imm_data; }
static uint32_t rd_qp_num(struct ibv_cq_ex *c) { return to_cq(c)->cur.qp_num; }
static uint32_t rd_src_qp(struct ibv_cq_ex *c) { return to_cq(c)->cur.src_qp; }
static unsigned int rd_wc_flags(struct ibv_cq_ex *c) { return to_cq(c)->cur.wc_flags; }
static uint32_t rd_slid(struct ibv_cq_ex *c) { return to_cq(c)->cur.slid; }
static uint8_t rd_sl(struct ibv_cq_ex *c) { return to_cq(c)->cur.sl; }
static uint8_t rd_dlid_path_bits(struct ibv_cq_ex *c)
{
	return to_cq(c)->cur.dlid_path_bits;
}

void sim_cq_ex_init(struct sim_cq *cq)
{
	struct ibv_cq_ex *c = &cq->cq;

	c->start_poll = sim_cq_ex_start;
	c->next_poll = sim_cq_ex_next;
	c->end_poll = sim_cq_ex_end;
	c->read_opcode = rd_opcode;
	c->read_vendor_err = rd_vendor_err;
	c->read_byte_len = rd_byte_len;
	c->read_imm_data = rd_imm;
	c->read_qp_num = rd_qp_num;
	c->read_src_qp = rd_src_qp;
	c->read_wc_flags = rd_wc_flags;
	c->read_slid = rd_slid;
	c->read_sl = rd_sl;
	c->read_dlid_path_bits = rd_dlid_path_bits;
}

static uint64_t rd_completion_ts(struct ibv_cq_ex *c)
{
	return sim_world_now(to_cq(c)->ctx->dev->w);
}

void sim_cq_ex_timestamps(struct sim_cq *cq)
{
	cq->cq.read_completion_ts = rd_completion_ts;
}
