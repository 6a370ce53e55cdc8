/*
 * The per-QP state machine (see state.h): the transition table, and the
 * check, count and debug log of every change the two setters in dp/dqp.c
 * make.
 */
#include "shift/dp/state.h"
#include "shift/base/log.h"

/* Legal send transitions, by state: a bit per target state */
#define TO(s) (1u << (s))
static const unsigned send_legal[SHIFT_SEND_NSTATES] = {
	[SHIFT_SEND_DEFAULT] = TO(SHIFT_SEND_FALLBACK) | TO(SHIFT_SEND_UNPROTECTED),
	[SHIFT_SEND_FALLBACK] = TO(SHIFT_SEND_WAIT_SIGNALED) | TO(SHIFT_SEND_WAIT_DRAINED) |
				TO(SHIFT_SEND_DEFAULT) | TO(SHIFT_SEND_UNPROTECTED),
	[SHIFT_SEND_WAIT_SIGNALED] = TO(SHIFT_SEND_WAIT_DRAINED) | TO(SHIFT_SEND_FALLBACK) |
				     TO(SHIFT_SEND_UNPROTECTED),
	[SHIFT_SEND_WAIT_DRAINED] = TO(SHIFT_SEND_DEFAULT) | TO(SHIFT_SEND_FALLBACK) |
				    TO(SHIFT_SEND_WAIT_SIGNALED) | TO(SHIFT_SEND_UNPROTECTED),
	[SHIFT_SEND_UNPROTECTED] = 0,
};
static const unsigned recv_legal[SHIFT_RECV_NSTATES] = {
	[SHIFT_RECV_DEFAULT] = TO(SHIFT_RECV_FALLBACK),
	[SHIFT_RECV_FALLBACK] = TO(SHIFT_RECV_DEFAULT),
};

static const unsigned ep_legal[SHIFT_EP_NSTATES] = {
	[SHIFT_EP_RUNNING] = TO(SHIFT_EP_WAIT_RESET) | TO(SHIFT_EP_WAIT_PEER) | TO(SHIFT_EP_WAIT_RETURN),
	[SHIFT_EP_WAIT_RESET] = TO(SHIFT_EP_RUNNING),
	[SHIFT_EP_WAIT_PEER] = TO(SHIFT_EP_RUNNING),
	[SHIFT_EP_WAIT_RETURN] = TO(SHIFT_EP_RUNNING),
};

static unsigned long ep_count[SHIFT_EP_NSTATES][SHIFT_EP_NSTATES];
static unsigned long send_count[SHIFT_SEND_NSTATES][SHIFT_SEND_NSTATES];
static unsigned long recv_count[SHIFT_RECV_NSTATES][SHIFT_RECV_NSTATES];
static unsigned long illegal;

static const char *const send_names[SHIFT_SEND_NSTATES] = {
	"default", "fallback", "waitsig", "waitdrain", "unprot",
};
static const char *const recv_names[SHIFT_RECV_NSTATES] = { "default", "fallback" };
static const char *const ep_names[SHIFT_EP_NSTATES] = { "running", "wait-reset", "wait-peer",
							"wait-return" };

const char *shift_ep_wait_name(enum shift_ep_wait w)
{
	return (unsigned)w < SHIFT_EP_NSTATES ? ep_names[w] : "?";
}

const char *shift_send_state_name(enum shift_send_state s)
{
	return (unsigned)s < SHIFT_SEND_NSTATES ? send_names[s] : "?";
}

const char *shift_recv_state_name(enum shift_recv_state s)
{
	return (unsigned)s < SHIFT_RECV_NSTATES ? recv_names[s] : "?";
}

/* Count from -> to (a change), or an illegal one; false if illegal. */
static bool account(unsigned long *cell, unsigned legal, unsigned to, const char *dir,
		    const char *from_name, const char *to_name, const char *dev, unsigned qpn,
		    const char *why)
{
	if (!(legal & TO(to))) {
		__atomic_fetch_add(&illegal, 1, __ATOMIC_RELAXED);
		shift_err("%s QP %u: illegal %s state change %s -> %s (%s)", dev, qpn, dir,
			  from_name, to_name, why);
		return false;
	}
	__atomic_fetch_add(cell, 1, __ATOMIC_RELAXED);
	shift_debug("%s QP %u: %s %s -> %s (%s)", dev, qpn, dir, from_name, to_name, why);
	return true;
}

bool shift_state_send_change(enum shift_send_state from, enum shift_send_state to,
			     const char *dev, unsigned qpn, const char *why)
{
	if ((unsigned)from >= SHIFT_SEND_NSTATES || (unsigned)to >= SHIFT_SEND_NSTATES)
		return false;
	return account(&send_count[from][to], send_legal[from], to, "send",
		       shift_send_state_name(from), shift_send_state_name(to), dev, qpn, why);
}

bool shift_state_recv_change(enum shift_recv_state from, enum shift_recv_state to,
			     const char *dev, unsigned qpn, const char *why)
{
	if ((unsigned)from >= SHIFT_RECV_NSTATES || (unsigned)to >= SHIFT_RECV_NSTATES)
		return false;
	return account(&recv_count[from][to], recv_legal[from], to, "receive",
		       shift_recv_state_name(from), shift_recv_state_name(to), dev, qpn, why);
}

bool shift_state_ep_change(enum shift_ep_wait from, enum shift_ep_wait to, const char *dev,
			   unsigned qpn, const char *why)
{
	if ((unsigned)from >= SHIFT_EP_NSTATES || (unsigned)to >= SHIFT_EP_NSTATES)
		return false;
	return account(&ep_count[from][to], ep_legal[from], to, "episode",
		       shift_ep_wait_name(from), shift_ep_wait_name(to), dev, qpn, why);
}

unsigned long shift_dqp_transitions(bool send, unsigned from, unsigned to)
{
	if (send)
		return from < SHIFT_SEND_NSTATES && to < SHIFT_SEND_NSTATES ?
			       __atomic_load_n(&send_count[from][to], __ATOMIC_RELAXED) : 0;
	return from < SHIFT_RECV_NSTATES && to < SHIFT_RECV_NSTATES ?
		       __atomic_load_n(&recv_count[from][to], __ATOMIC_RELAXED) : 0;
}

unsigned long shift_dqp_illegal_transitions(void)
{
	return __atomic_load_n(&illegal, __ATOMIC_RELAXED);
}
