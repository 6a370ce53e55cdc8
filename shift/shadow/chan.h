/*
 * Completion channels across a failover (shift/shadow/chan.c).
 *
 * Once a QP failed over, its completions arrive on the backup CQ, which
 * lives on the backup NIC's context and reports to its own backup channel
 * (replay.c creates one per application CQ that has a channel). An
 * application blocked in ibv_get_cq_event() on its own channel must still
 * wake up: SHIFT's ibv_get_cq_event waits on the application's channel and
 * on the backup channels of the CQs attached to it, and reports a backup
 * event as an event of the application's CQ. ibv_req_notify_cq arms the
 * backup CQ with the application's. Acks of such synthetic events are
 * swallowed (the real library's destroy_cq waits for exactly the events
 * the kernel reported to be acked).
 */
#ifndef SHIFT_CHAN_H
#define SHIFT_CHAN_H

#include <infiniband/verbs.h>

struct shift_ctx;
struct shift_rnic;
struct shift_cq;

/* Track / forget an application channel (after the lower verb succeeded). */
void shift_chan_created(struct shift_ctx *s, struct ibv_comp_channel *channel);
void shift_chan_destroyed(struct ibv_comp_channel *channel);

/*
 * Around a call of the real library that reads channel->fd (create_cq,
 * create_cq_ex, destroy_comp_channel): the channel's own fd is in
 * channel->fd from begin to end (the application's is an epoll set).
 * end's channel is NULL when the call freed it. begin returns NULL (and
 * end does nothing) for a channel SHIFT does not track.
 */
struct shift_chan;
struct shift_chan *shift_chan_lower_begin(struct ibv_comp_channel *channel);
void shift_chan_lower_end(struct shift_chan *k, struct ibv_comp_channel *channel);

/* ibv_get_cq_event / ibv_ack_cq_events through SHIFT. */
int shift_chan_get_cq_event(struct ibv_comp_channel *channel, struct ibv_cq **cq,
			    void **cq_context);
void shift_chan_ack_cq_events(struct ibv_cq *cq, unsigned int nevents);

/* The application armed cq (its provider's arm succeeded): arm its backup. */
void shift_chan_arm_backup(struct shift_ctx *s, struct ibv_cq *cq, int solicited_only);

/* The backup of c has just become READY (RNIC thread): arm it once (the
 * application may have armed c before its backup existed) and make waiters
 * on c's channel include it. */
void shift_chan_backup_ready(struct shift_rnic *r, struct shift_cq *c);

/* The application is destroying cq: detach it from its channel first (no
 * event of its backup may name it once the provider freed it); returns the
 * channel, to reattach if the destroy fails. */
struct ibv_comp_channel *shift_chan_cq_detach(struct shift_rnic *r, struct ibv_cq *cq);
void shift_chan_cq_reattach(struct shift_rnic *r, struct ibv_cq *cq,
			    struct ibv_comp_channel *ch);

/* fork() (shift/fork.c): the registry stays whole across it; a child gets
 * each channel's own fd back in channel->fd and SHIFT forgets it there
 * (the channels are its parent's, and so are their backups). */
void shift_chan_fork_prepare(void);
void shift_chan_fork_parent(void);
void shift_chan_fork_child(void);

#endif /* SHIFT_CHAN_H */
