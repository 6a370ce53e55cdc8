/*
 * Completion channels across a failover (see chan.h).
 *
 * Per application channel of a protected context SHIFT keeps a record: a
 * mutex that lets one SHIFT waiter at a time wait on the channel, and an
 * eventfd ("kick") written when a CQ of the channel gets its backup, so a
 * waiter that is already asleep includes the new backup channel.
 *
 * ibv_get_cq_event on such a channel poll()s the channel's own fd, the kick
 * and the backup channel fd of every CQ of the channel whose backup is
 * READY. A backup event is read and acked at once on the backup CQ (the
 * real library's bookkeeping of the backup CQ stays exact) and reported as
 * an event of the application's CQ, with its cq_context; the application's
 * CQ counts it as synthetic, and ibv_ack_cq_events forwards only the acks
 * beyond the synthetic ones, so the real destroy_cq (which waits until the
 * acked count equals the events the kernel reported) neither hangs nor
 * sees too many acks.
 *
 * Applications that wait on channel->fd themselves (poll/epoll, then
 * ibv_get_cq_event, as event loops do) must wake on backup completions too:
 * the fd the application sees in channel->fd is an epoll set holding the
 * channel's own fd and the backup channel of each of its CQs once READY
 * (a closed backup channel leaves the set by itself). The real fd stays
 * SHIFT's: calls of the real library that read channel->fd (create_cq,
 * create_cq_ex, destroy_comp_channel) get it back for their duration
 * (shift_chan_lower_begin/end), get_cq_event reads it through a copy.
 *
 * Lost wakeups: req_notify_cq arms the backup CQ with the application's;
 * a backup CQ is armed once when it is created (the application may have
 * armed its CQ before); the kick covers a waiter that started before the
 * backup existed. Spurious wakeups (SHIFT's own control completions on a
 * backup CQ, the arm at creation) are allowed by verbs semantics.
 *
 * Locks: chans_lock (registry) > nothing; k->wait_lock is held across the
 * wait, never while taking chans_lock; r->lock is taken for the snapshot and
 * for reading one backup event (a poll()ed fd: the read cannot block, and
 * under r->lock the RNIC thread cannot reap the backup channel meanwhile).
 * The backup CQ is armed under its dp_lock (the application's arm and the
 * RNIC thread's arm at creation may otherwise race in the provider).
 */
#include "shift/shadow/chan.h"
#include "shift/shadow/types.h"
#include "shift/shadow/shadow.h"
#include "shift/base/lower.h"
#include "shift/dp/ctx.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#define L (shift_lower)

struct shift_chan {
	struct shift_chan *next;        /* (chans_lock) */
	struct ibv_comp_channel *ch;
	struct shift_rnic *r;
	pthread_mutex_t wait_lock;      /* one SHIFT waiter at a time */
	int kick_fd;                    /* eventfd, non-blocking */
	int real_fd;                    /* the channel's own fd */
	int ep_fd;                      /* channel->fd: real_fd + READY backups; -1: none */
	pthread_mutex_t fd_lock;        /* channel->fd is real_fd across a lower call */
	/* the waiter's poll set (under wait_lock) */
	struct pollfd *pf;
	struct shift_cq **cs;
	unsigned cap;
};

static pthread_mutex_t chans_lock = PTHREAD_MUTEX_INITIALIZER;
static struct shift_chan *chans;

static struct shift_chan *lookup_locked(const struct ibv_comp_channel *ch)
{
	for (struct shift_chan *k = chans; k; k = k->next)
		if (k->ch == ch)
			return k;
	return NULL;
}

void shift_chan_created(struct shift_ctx *s, struct ibv_comp_channel *channel)
{
	struct shift_chan *k;

	if (!s || !s->rnic || !channel)
		return;
	k = calloc(1, sizeof(*k));
	if (!k)
		goto fail;
	k->kick_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (k->kick_fd < 0) {
		free(k);
		goto fail;
	}
	k->ch = channel;
	k->r = s->rnic;
	k->real_fd = channel->fd;
	k->ep_fd = epoll_create1(EPOLL_CLOEXEC);
	if (k->ep_fd >= 0) {
		struct epoll_event ev = { .events = EPOLLIN, .data.fd = k->real_fd };

		if (epoll_ctl(k->ep_fd, EPOLL_CTL_ADD, k->real_fd, &ev)) {
			close(k->ep_fd);
			k->ep_fd = -1;
		}
	}
	if (k->ep_fd < 0)
		shift_warn("completion channel: no epoll set (%s): after a failover, an application "
			   "waiting on channel->fd itself wakes only on the default NIC's events",
			   strerror(errno));
	else
		channel->fd = k->ep_fd; /* what the application sees and waits on */
	pthread_mutex_init(&k->wait_lock, NULL);
	pthread_mutex_init(&k->fd_lock, NULL);
	pthread_mutex_lock(&chans_lock);
	k->next = chans;
	chans = k;
	pthread_mutex_unlock(&chans_lock);
	return;
fail:
	shift_warn("completion channel: cannot track it (%s): after a failover its "
		   "waiters wake only when the application polls", strerror(errno));
}

void shift_chan_fork_prepare(void)
{
	pthread_mutex_lock(&chans_lock);
}

void shift_chan_fork_parent(void)
{
	pthread_mutex_unlock(&chans_lock);
}

void shift_chan_fork_child(void)
{
	while (chans) {
		struct shift_chan *k = chans;

		chans = k->next;
		k->ch->fd = k->real_fd; /* as the plain library left it */
		close(k->kick_fd); /* (the parent's copies stay open) */
		if (k->ep_fd >= 0)
			close(k->ep_fd);
		free(k->pf);
		free(k->cs);
		free(k); /* (its mutexes may be held: never used again) */
	}
	pthread_mutex_unlock(&chans_lock);
}

void shift_chan_destroyed(struct ibv_comp_channel *channel)
{
	struct shift_chan *k = NULL;

	pthread_mutex_lock(&chans_lock);
	for (struct shift_chan **pp = &chans; *pp; pp = &(*pp)->next) {
		if ((*pp)->ch == channel) {
			k = *pp;
			*pp = k->next;
			break;
		}
	}
	pthread_mutex_unlock(&chans_lock);
	if (!k)
		return;
	close(k->kick_fd);
	if (k->ep_fd >= 0)
		close(k->ep_fd);
	pthread_mutex_destroy(&k->wait_lock);
	pthread_mutex_destroy(&k->fd_lock);
	free(k->pf);
	free(k->cs);
	free(k);
}

struct shift_chan *shift_chan_lower_begin(struct ibv_comp_channel *channel)
{
	struct shift_chan *k;

	if (!channel)
		return NULL;
	pthread_mutex_lock(&chans_lock);
	k = lookup_locked(channel);
	pthread_mutex_unlock(&chans_lock);
	if (!k || k->ep_fd < 0)
		return NULL;
	pthread_mutex_lock(&k->fd_lock);
	channel->fd = k->real_fd;
	return k;
}

void shift_chan_lower_end(struct shift_chan *k, struct ibv_comp_channel *channel)
{
	if (!k)
		return;
	if (channel)
		channel->fd = k->ep_fd;
	pthread_mutex_unlock(&k->fd_lock);
}

/* The real library's get_cq_event on the channel's own fd: a copy of the
 * channel carries it (that verb reads nothing else of it). */
static int own_get_cq_event(struct shift_chan *k, struct ibv_cq **cq, void **cq_context)
{
	struct ibv_comp_channel own = { .context = k->ch->context, .fd = k->real_fd };

	return L->get_cq_event(&own, cq, cq_context);
}

/* Is c still one of r's live CQs attached to ch? (r->lock held) */
static bool cq_live_locked(struct shift_rnic *r, struct shift_cq *c,
			   const struct ibv_comp_channel *ch)
{
	for (struct shift_cq *x = r->cqs; x; x = x->next)
		if (x == c)
			return !c->dead && c->app_channel == ch && c->state == SHIFT_SHADOW_READY &&
			       c->bk && c->bk_channel;
	return false;
}

/* Read one event of c's backup channel (poll() said it is readable), ack
 * it there, report it as the application's. 0, or -1 (not c's any more). */
static int take_backup(struct shift_chan *k, struct shift_cq *c, struct ibv_cq **cq,
		       void **cq_context)
{
	struct shift_rnic *r = k->r;
	int rc = -1;

	pthread_mutex_lock(&r->lock);
	if (cq_live_locked(r, c, k->ch)) {
		struct ibv_cq *bcq;
		void *bctx;

		if (L->get_cq_event(c->bk_channel, &bcq, &bctx) == 0) {
			L->ack_cq_events(bcq, 1);
			__atomic_fetch_add(&c->synth_events, 1, __ATOMIC_RELAXED);
			*cq = c->app;
			*cq_context = c->app->cq_context;
			rc = 0;
		}
	}
	pthread_mutex_unlock(&r->lock);
	/* in the Default state only a peer's handshake message completes
	 * there, and the RNIC's thread answers it (fo/background.c); once
	 * failed over, the application's polls look at the backup anyway */
	if (!rc && !__atomic_load_n(&r->sctx->slow, __ATOMIC_ACQUIRE))
		shift_rnic_wake(r);
	return rc;
}

/* The poll set: the channel, the kick, the READY backups of its CQs.
 * Number of backups, or -1 (out of memory). wait_lock held. */
static int snapshot(struct shift_chan *k)
{
	struct shift_rnic *r = k->r;

	for (;;) {
		unsigned n = 0, want = 0;

		pthread_mutex_lock(&r->lock);
		for (struct shift_cq *c = r->cqs; c; c = c->next) {
			if (c->dead || c->app_channel != k->ch || c->state != SHIFT_SHADOW_READY ||
			    !c->bk || !c->bk_channel)
				continue;
			want++;
			if (2 + n < k->cap) {
				k->cs[n] = c;
				k->pf[2 + n] = (struct pollfd){ .fd = c->bk_channel->fd, .events = POLLIN };
				n++;
			}
		}
		pthread_mutex_unlock(&r->lock);
		if (k->cap >= 2 && n == want) {
			k->pf[0] = (struct pollfd){ .fd = k->real_fd, .events = POLLIN };
			k->pf[1] = (struct pollfd){ .fd = k->kick_fd, .events = POLLIN };
			return (int)n;
		}
		unsigned cap = 2 * (want + 2) + 6;
		struct pollfd *pf = realloc(k->pf, cap * sizeof(*pf));

		if (pf)
			k->pf = pf;
		struct shift_cq **cs = realloc(k->cs, cap * sizeof(*cs));

		if (cs)
			k->cs = cs;
		if (!pf || !cs)
			return -1;
		k->cap = cap;
	}
}

static int wait_locked(struct shift_chan *k, bool nonblock, struct ibv_cq **cq,
		       void **cq_context)
{
	for (;;) {
		int nb = snapshot(k);

		if (nb < 0) {
			/* no memory for the poll set: the plain wait, as without SHIFT */
			return own_get_cq_event(k, cq, cq_context);
		}
		int pr = poll(k->pf, (nfds_t)(2 + nb), nonblock ? 0 : -1);

		if (pr < 0)
			return -1; /* EINTR and friends, like the real read() */
		if (pr == 0) {
			errno = EAGAIN;
			return -1;
		}
		if (k->pf[0].revents)
			return own_get_cq_event(k, cq, cq_context);
		for (int i = 0; i < nb; i++)
			if (k->pf[2 + i].revents && take_backup(k, k->cs[i], cq, cq_context) == 0)
				return 0;
		if (k->pf[1].revents) {
			uint64_t v;

			if (read(k->kick_fd, &v, sizeof(v)) < 0 && errno != EAGAIN)
				shift_debug("completion channel: kick: %s", strerror(errno));
		}
		/* the set changed (kick, or a CQ went away): look again */
	}
}

static void unlock_wait(void *arg)
{
	pthread_mutex_unlock(&((struct shift_chan *)arg)->wait_lock);
}

/* wait_locked(), unlocking the channel if the thread is cancelled in poll() */
static int wait_cancellable(struct shift_chan *const k, const bool nonblock,
			    struct ibv_cq **const cq, void **const cq_context)
{
	int rc;

	pthread_cleanup_push(unlock_wait, k);
	rc = wait_locked(k, nonblock, cq, cq_context);
	pthread_cleanup_pop(0);
	return rc;
}

int shift_chan_get_cq_event(struct ibv_comp_channel *channel, struct ibv_cq **cq,
			    void **cq_context)
{
	struct shift_chan *k = NULL;
	int rc, fl, err;
	bool nonblock;

	if (channel) {
		pthread_mutex_lock(&chans_lock);
		k = lookup_locked(channel);
		pthread_mutex_unlock(&chans_lock);
	}
	if (!k)
		return L->get_cq_event(channel, cq, cq_context);
	/* the application sets O_NONBLOCK on the fd it sees (k->ch->fd may
	 * be the real one for the moment of a lower call) */
	fl = fcntl(k->ep_fd >= 0 ? k->ep_fd : k->real_fd, F_GETFL);
	nonblock = fl >= 0 && (fl & O_NONBLOCK);
	if (nonblock) {
		if (pthread_mutex_trylock(&k->wait_lock)) {
			errno = EAGAIN; /* another thread is waiting on the channel */
			return -1;
		}
	} else {
		pthread_mutex_lock(&k->wait_lock);
	}
	rc = wait_cancellable(k, nonblock, cq, cq_context);
	err = errno;
	pthread_mutex_unlock(&k->wait_lock);
	errno = err;
	return rc;
}

void shift_chan_ack_cq_events(struct ibv_cq *cq, unsigned int nevents)
{
	struct shift_ctx *s = cq && cq->channel ? shift_ctx_of(cq->context) : NULL;
	struct shift_cq *c = s && s->rnic ? shift_shadow_cq_of(s->rnic, cq) : NULL;

	if (c) {
		unsigned have = __atomic_load_n(&c->synth_events, __ATOMIC_RELAXED), take;

		do {
			take = have < nevents ? have : nevents;
		} while (take && !__atomic_compare_exchange_n(&c->synth_events, &have, have - take,
							      false, __ATOMIC_RELAXED,
							      __ATOMIC_RELAXED));
		nevents -= take;
	}
	if (nevents)
		L->ack_cq_events(cq, nevents);
}

/* Arm c's backup CQ (no lock held; c live). */
static void arm(struct shift_cq *c, struct ibv_cq *bk, int solicited_only)
{
	pthread_mutex_lock(&c->dp_lock);
	int rc = ibv_req_notify_cq(bk, solicited_only);
	pthread_mutex_unlock(&c->dp_lock);
	if (rc)
		shift_debug("backup CQ arm failed (%s)", strerror(rc));
}

void shift_chan_arm_backup(struct shift_ctx *s, struct ibv_cq *cq, int solicited_only)
{
	struct shift_rnic *r = s->rnic;
	struct shift_cq *c;
	struct ibv_cq *bk = NULL;

	if (!r || !cq->channel)
		return;
	pthread_mutex_lock(&r->lock);
	for (c = r->cqs; c; c = c->next)
		if (c->app == cq && !c->dead)
			break;
	if (c && c->state == SHIFT_SHADOW_READY && c->bk_channel)
		bk = c->bk;
	pthread_mutex_unlock(&r->lock);
	if (bk)
		arm(c, bk, solicited_only);
}

void shift_chan_backup_ready(struct shift_rnic *r, struct shift_cq *c)
{
	const struct ibv_comp_channel *ch;

	if (!c->bk || !c->bk_channel)
		return;
	arm(c, c->bk, 0);
	pthread_mutex_lock(&r->lock);
	ch = c->dead ? NULL : c->app_channel;
	pthread_mutex_unlock(&r->lock);
	if (!ch)
		return;
	pthread_mutex_lock(&chans_lock);
	struct shift_chan *k = lookup_locked(ch);
	if (k) {
		uint64_t one = 1;
		struct epoll_event ev = { .events = EPOLLIN, .data.fd = c->bk_channel->fd };

		/* the application's own waits on channel->fd include it (a
		 * closed backup channel leaves the set by itself) */
		if (k->ep_fd >= 0 && epoll_ctl(k->ep_fd, EPOLL_CTL_ADD, c->bk_channel->fd, &ev) &&
		    errno != EEXIST)
			shift_debug("completion channel: epoll add: %s", strerror(errno));

		if (write(k->kick_fd, &one, sizeof(one)) < 0 && errno != EAGAIN)
			shift_debug("completion channel: kick: %s", strerror(errno));
	}
	pthread_mutex_unlock(&chans_lock);
}

/* The application is destroying cq: no more events for it from its backup
 * (its cq_context is gone once the provider's destroy returns). Returns
 * the channel to give back if the destroy fails. */
struct ibv_comp_channel *shift_chan_cq_detach(struct shift_rnic *r, struct ibv_cq *cq)
{
	struct ibv_comp_channel *ch = NULL;

	if (!r || !cq->channel)
		return NULL;
	pthread_mutex_lock(&r->lock);
	for (struct shift_cq *c = r->cqs; c; c = c->next) {
		if (c->app == cq && !c->dead) {
			ch = c->app_channel;
			c->app_channel = NULL;
			break;
		}
	}
	pthread_mutex_unlock(&r->lock);
	return ch;
}

void shift_chan_cq_reattach(struct shift_rnic *r, struct ibv_cq *cq,
			    struct ibv_comp_channel *ch)
{
	if (!r || !ch)
		return;
	pthread_mutex_lock(&r->lock);
	for (struct shift_cq *c = r->cqs; c; c = c->next) {
		if (c->app == cq && !c->dead) {
			c->app_channel = ch;
			break;
		}
	}
	pthread_mutex_unlock(&r->lock);
}
