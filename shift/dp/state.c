/*
 * The per-QP state machine's one writer (see state.h): every send and
 * receive state change of every protected QP goes through the two setters
 * below, which check it against the transition table, count it and log it
 * at debug level.
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

static unsigned long send_count[SHIFT_SEND_NSTATES][SHIFT_SEND_NSTATES];
static unsigned long recv_count[SHIFT_RECV_NSTATES][SHIFT_RECV_NSTATES];
static unsigned long illegal;

static const char *const send_names[SHIFT_SEND_NSTATES] = {
	"default", "fallback", "waitsig", "waitdrain", "unprot",
};
static const char *const recv_names[SHIFT_RECV_NSTATES] = { "default", "fallback" };

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
		    const char *from_name, const char *to_name, const struct shift_dqp *d,
		    const char *why)
{
	if (!(legal & TO(to))) {
		__atomic_fetch_add(&illegal, 1, __ATOMIC_RELAXED);
		shift_err("%s QP %u: illegal %s state change %s -> %s (%s)", d->dev, d->qpn, dir,
			  from_name, to_name, why);
		return false;
	}
	__atomic_fetch_add(cell, 1, __ATOMIC_RELAXED);
	shift_debug("%s QP %u: %s %s -> %s (%s)", d->dev, d->qpn, dir, from_name, to_name, why);
	return true;
}

void shift_dqp_set_send_state(struct shift_dqp *d, enum shift_send_state to, const char *why)
{
	enum shift_send_state from = __atomic_load_n(&d->send_state, __ATOMIC_RELAXED);

	if (from != to)
		account(&send_count[from][to], send_legal[from], to, "send",
			shift_send_state_name(from), shift_send_state_name(to), d, why);
	/* (an illegal change is made all the same: the caller's view of the
	 * QP must hold; the count and the error line say it happened) */
	__atomic_store_n(&d->send_state, to, __ATOMIC_RELEASE);
	/* the fast paths' bounds are computed again, for the new state, at
	 * the next post */
	d->sq_limit = 0;
	d->rq_limit = 0;
}

void shift_dqp_set_recv_state(struct shift_dqp *d, enum shift_recv_state to, const char *why)
{
	enum shift_recv_state from = __atomic_load_n(&d->recv_state, __ATOMIC_RELAXED);

	if (from != to)
		account(&recv_count[from][to], recv_legal[from], to, "receive",
			shift_recv_state_name(from), shift_recv_state_name(to), d, why);
	__atomic_store_n(&d->recv_state, to, __ATOMIC_RELEASE);
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
