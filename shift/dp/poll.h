/*
 * The poll verbs SHIFT installs on a context it took over (dp/poll.c).
 */
#ifndef SHIFT_DP_POLL_H
#define SHIFT_DP_POLL_H

#include <infiniband/verbs.h>

struct shift_ctx;
struct shift_dqp;

typedef int (*shift_poll_fn)(struct ibv_cq *cq, int num_entries, struct ibv_wc *wc);

/* The fast poll_cq of a context (per slot; lean or full, split_cqs). */
shift_poll_fn shift_dp_fast_poll(const struct shift_ctx *s);
/* The poll_cq of a slow context: the failover layer's. */
int shift_dp_poll_slow(struct ibv_cq *cq, int num_entries, struct ibv_wc *wc);
int shift_dp_req_notify_cq(struct ibv_cq *cq, int solicited_only);

/* s took its slot (s->slot, s->poll_cq set); d leaves s's last-polled
 * cache. */
void shift_dp_poll_slot_init(struct shift_ctx *s);
void shift_dp_poll_forget(struct shift_ctx *s, struct shift_dqp *d);

#endif /* SHIFT_DP_POLL_H */
