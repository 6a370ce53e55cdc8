/*
 * The data-path state machine of a protected QP, in one place.
 *
 * Send: Default -> Fallback -> WaitSignaled -> WaitDrained -> Default (the
 * paper's cycle: fail over, then fail back fencing the next signaled WR),
 * plus Unprotected, final, reached from any state when a QP can no longer
 * be protected (the mirror overflowed, an atomic was in flight, the
 * application ended the connection). SHIFT's own additions, each a change
 * the table below allows and docs/failover.md explains: Fallback ->
 * WaitDrained (nothing signaled outstanding when the probe answered: the
 * last WR is the fence), Fallback -> Default (a receive-only QP, or a
 * return episode: the backup failed and both ends went back), WaitSignaled
 * or WaitDrained -> Fallback (the default path failed again before the
 * switch), WaitDrained -> WaitSignaled (the fence could not be posted).
 * Receive: Default <-> Fallback. A failover episode's wait (enum
 * shift_ep_wait, below) is a third, small machine of the same kind.
 *
 * shift_dqp_set_send_state() and shift_dqp_set_recv_state() (dp/dqp.c) are
 * the only code that writes a state (tests/structure checks it). Each has
 * the change checked against the table here, counted
 * (shift_dqp_transitions()) and logged at debug level; an illegal change is
 * logged as an error and counted in shift_dqp_illegal_transitions(), which
 * the campaigns and tests require to stay 0. Setting the state a QP is in
 * already is no change.
 */
#ifndef SHIFT_DP_STATE_H
#define SHIFT_DP_STATE_H

#include <stdbool.h>

enum shift_send_state {
	SHIFT_SEND_DEFAULT,
	SHIFT_SEND_FALLBACK,
	SHIFT_SEND_WAIT_SIGNALED,
	SHIFT_SEND_WAIT_DRAINED,
	SHIFT_SEND_UNPROTECTED, /* mirror overflowed or the QP failed for good */
};

enum shift_recv_state {
	SHIFT_RECV_DEFAULT,
	SHIFT_RECV_FALLBACK,
};

/* What a failover episode waits for (fo/): nothing (running), the peer to
 * stop its old backup before mine is reset (a failover that started again
 * before the last one ended), the peer's backup to be reset for this
 * episode before my handshake message goes out, or the peer's receive
 * counter of a return episode (through the KV store). At most one at a
 * time: Running -> any wait -> Running. */
enum shift_ep_wait {
	SHIFT_EP_RUNNING,
	SHIFT_EP_WAIT_RESET,
	SHIFT_EP_WAIT_PEER,
	SHIFT_EP_WAIT_RETURN,
};

#define SHIFT_SEND_NSTATES (SHIFT_SEND_UNPROTECTED + 1)
#define SHIFT_RECV_NSTATES (SHIFT_RECV_FALLBACK + 1)
#define SHIFT_EP_NSTATES (SHIFT_EP_WAIT_RETURN + 1)

/* A change of a QP's send (receive) state from -> to, by its setter in
 * dp/dqp.c: false if the table does not allow it (logged as an error and
 * counted); else counted and logged at debug level. dev and qpn name the
 * QP in the log. */
bool shift_state_send_change(enum shift_send_state from, enum shift_send_state to,
			     const char *dev, unsigned qpn, const char *why);
bool shift_state_recv_change(enum shift_recv_state from, enum shift_recv_state to,
			     const char *dev, unsigned qpn, const char *why);

bool shift_state_ep_change(enum shift_ep_wait from, enum shift_ep_wait to, const char *dev,
			   unsigned qpn, const char *why);

const char *shift_send_state_name(enum shift_send_state s);
const char *shift_ep_wait_name(enum shift_ep_wait w);
const char *shift_recv_state_name(enum shift_recv_state s);

/* Changes made so far, process-wide, of the send (or receive) state. */
unsigned long shift_dqp_transitions(bool send, unsigned from, unsigned to);
unsigned long shift_dqp_illegal_transitions(void);

#endif /* SHIFT_DP_STATE_H */
