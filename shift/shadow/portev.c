/*
 * Port events of the application's device, for the RNIC's thread: fast
 * local detection (issue #19, item 5).
 *
 * The application's own context delivers its async events to the
 * application (SHIFT must not take them). The thread opens a context of
 * its own on the same device, whose async fd it polls beside its kick
 * eventfd (rnic.c, wait_kick): a port that leaves ACTIVE (IBV_EVENT_PORT_ERR)
 * or a device that dies (IBV_EVENT_DEVICE_FATAL) wakes the thread at once,
 * and the port watch (fo/background.c) fails that port's QPs over after
 * the grace that lets a fast-path poll finish instead of after
 * SHIFT_PORT_DOWN_MS. PORT_ACTIVE clears the mark; flaps are then the
 * failback probe's business, with its backoff. Without such a context
 * (it cannot be opened; synchronous mode) the port watch polls as before.
 */
#include "shift/shadow/shadow_int.h"
#include "shift/base/lower.h"
#include "shift/base/log.h"
#include "shift/dp/ctx.h"

#include <errno.h>
#include <fcntl.h>

/* (the thread reads its fds only when poll() says so, and until empty) */
bool shift_fd_nonblocking(int fd)
{
	int fl = fcntl(fd, F_GETFL);

	return fl >= 0 && fcntl(fd, F_SETFL, fl | O_NONBLOCK) >= 0;
}

void shift_portev_open(struct shift_rnic *r)
{
	struct ibv_device *dev = r->sctx->ibctx->device;

	r->ev_ctx = dev ? shift_lower->open_device(dev) : NULL;
	if (!r->ev_ctx) {
		shift_info("%s: no context of its own for port events: ports are polled every "
			   "pass", r->name);
		return;
	}
	if (!shift_fd_nonblocking(r->ev_ctx->async_fd)) {
		shift_lower->close_device(r->ev_ctx);
		r->ev_ctx = NULL;
	}
}

void shift_portev_close(struct shift_rnic *r)
{
	if (r->ev_ctx)
		shift_lower->close_device(r->ev_ctx);
	r->ev_ctx = NULL;
}

int shift_portev_fd(const struct shift_rnic *r)
{
	return r->ev_ctx ? r->ev_ctx->async_fd : -1;
}

_Static_assert(sizeof(((struct shift_rnic *)0)->port_err) > SHIFT_WATCH_PORTS,
	       "a mark for every watched port");

static void mark(struct shift_rnic *r, unsigned port, bool down)
{
	if (port < 1 || port > SHIFT_WATCH_PORTS)
		return;
	__atomic_store_n(&r->port_err[port], down, __ATOMIC_RELAXED);
}

/* Every event queued on the thread's context (its fd readable). */
void shift_portev_drain(struct shift_rnic *r)
{
	struct ibv_async_event ev;

	while (r->ev_ctx && !shift_lower->get_async_event(r->ev_ctx, &ev)) {
		switch (ev.event_type) {
		case IBV_EVENT_PORT_ERR:
			shift_info("%s: port %d left ACTIVE (async event)", r->name,
				   ev.element.port_num);
			mark(r, (unsigned)ev.element.port_num, true);
			break;
		case IBV_EVENT_PORT_ACTIVE:
			mark(r, (unsigned)ev.element.port_num, false);
			break;
		case IBV_EVENT_DEVICE_FATAL:
			shift_info("%s: device fatal error (async event)", r->name);
			for (unsigned p = 1; p <= SHIFT_WATCH_PORTS; p++)
				mark(r, p, true);
			break;
		default:
			break;
		}
		shift_lower->ack_async_event(&ev);
	}
}

bool shift_rnic_port_event_down(struct shift_rnic *r, unsigned port)
{
	return r && port >= 1 && port <= SHIFT_WATCH_PORTS &&
	       __atomic_load_n(&r->port_err[port], __ATOMIC_RELAXED);
}

/* ---- backup completions --------------------------------------------------
 *
 * A peer's handshake message lands in a backup CQ that nobody polls while
 * this side is in the Default state. Backup CQs whose application CQ has
 * no completion channel report to one channel of the thread's (those with
 * one report to a backup channel of their own, which the application's
 * get_cq_event reads and which wakes the thread from there, chan.c); the
 * background pass arms them before it polls them, so a completion after
 * that pass wakes the thread at once instead of after its idle period.
 * Every event is acked as soon as it is read: destroying a backup CQ
 * (reap, on this thread) never waits for an ack.
 */
void shift_bkev_open(struct shift_rnic *r)
{
	r->bk_ev = shift_lower->create_comp_channel(r->bk_ctx);
	if (!r->bk_ev) {
		shift_info("%s: no completion channel on %s: backup CQs are polled every pass",
			   r->name, r->bk_name);
		return;
	}
	if (!shift_fd_nonblocking(r->bk_ev->fd)) {
		shift_lower->destroy_comp_channel(r->bk_ev);
		r->bk_ev = NULL;
	}
}

/* (after every backup CQ on it was destroyed) */
void shift_bkev_close(struct shift_rnic *r)
{
	if (r->bk_ev && shift_lower->destroy_comp_channel(r->bk_ev))
		shift_warn("%s: the backup completion channel is still in use", r->name);
	r->bk_ev = NULL;
}

void shift_comp_drain(struct ibv_comp_channel *ch)
{
	struct ibv_cq *cq;
	void *ctx;

	while (ch && !shift_lower->get_cq_event(ch, &cq, &ctx))
		shift_lower->ack_cq_events(cq, 1);
}

void shift_bkev_drain(struct shift_rnic *r)
{
	shift_comp_drain(r->bk_ev);
}

void shift_rnic_arm_backup(struct shift_rnic *r, struct ibv_cq *bk)
{
	if (r && r->bk_ev && bk && bk->channel == r->bk_ev && ibv_req_notify_cq(bk, 0))
		shift_debug("%s: a backup CQ cannot be armed: polled every pass", r->name);
}
