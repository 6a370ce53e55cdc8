/*
 * Episode records as datagrams (the service channels, shift/shadow/svc.h).
 *
 * Each record an end writes for the KV store (fo_ep_publish) also goes,
 * at the same pass and sealed the same way (shift_kv_seal: authenticated
 * under the job's secret, bound to the record's key), straight to the
 * peer's service channels, on the backup path and on the default path
 * (whichever works: a second failover needs the first, a return to the
 * default QPs after a backup failure the second). The peer takes it as if its
 * own pass had read it from the store: a failed-over QP follows it at this
 * pass (d->kv_pref), a QP in the Default state whose peer started a
 * failover it never saw joins it, as after a poke (fo/poke.c). So the
 * agreements that went through the store (a second failover of one
 * episode, a return to the default QPs, a failover only one end saw) need
 * only the backup path, and are not held to the store's read schedule;
 * the store still carries every record (but a start's, fo_dgram_starting),
 * for the records a datagram lost
 * (UD is lossy: an end that waits puts its record again at the probe
 * period, which sends it again too) and for a peer without a channel.
 *
 * A record is taken only from the peer's own channel (the sender's QPN
 * is the one in the peer's QP record), for the connection it names, if it
 * opens under the peer's record key; one older than a record the QP took
 * already (its seq) changes nothing (fo/episode.c, ep_take).
 */
#include "shift/fo/fo_int.h"
#include "shift/shadow/svc.h"

#define DGRAM_MAGIC 0x31644853u /* "SHd1" */
#define DGRAM_EP 1u

/* (its numbers big-endian on the wire) */
struct dgram_hdr {
	uint32_t magic;
	uint16_t kind;
	uint16_t len;        /* the sealed record's bytes after the header */
	uint32_t dst_qpn;    /* the receiver's default QPN */
	uint32_t src_qpn;    /* the sender's default QPN */
	uint8_t src_gid[16]; /* the sender's default GID */
};

#define DGRAM_OUT 256

/* The records of this pass to send (collected under each QP's rk_lock;
 * the passes of all contexts take turns, bg_lock). */
static struct {
	struct shift_dqp *d;
	uint64_t serial;
	uint32_t qpn;
	char key[SHIFT_EXCHANGE_KEY_MAX];
	char val[SHIFT_KV_SLOT_VAL];
	unsigned len;
} out[DGRAM_OUT];
static unsigned nout;

/* d's record, if not sent as a datagram yet (rk_lock held; fo/kvq.c). */
void fo_dgram_collect(struct shift_dqp *d)
{
	const struct shift_kv_slot *sl = &d->ep_pub;

	if (sl->seq == d->dg_sent || !sl->len || !d->shadow ||
	    !(d->shadow->svc_ok[SHIFT_SVC_BACKUP] || d->shadow->svc_ok[SHIFT_SVC_DEFAULT]) ||
	    nout == DGRAM_OUT)
		return; /* (beyond DGRAM_OUT: the next pass) */
	d->dg_sent = sl->seq;
	out[nout].d = d, out[nout].serial = d->serial, out[nout].qpn = d->qpn;
	memcpy(out[nout].key, sl->key, sizeof(out[nout].key));
	memcpy(out[nout].val, sl->val, sl->len);
	out[nout++].len = sl->len;
}

/* d's record (key, val) to its peer on each path that may carry it: how
 * many took it. */
static int send_one(struct shift_ctx *s, struct shift_dqp *d, const char *key, const char *val,
		    unsigned len)
{
	struct shift_rnic *r = s->rnic;
	struct shift_qp *q = d->shadow;
	uint8_t msg[SHIFT_SVC_MSG_MAX];
	struct dgram_hdr h = { .magic = htobe32(DGRAM_MAGIC), .kind = htobe16(DGRAM_EP),
			       .dst_qpn = htobe32(q->peer_key.qpn), .src_qpn = htobe32(q->my_key.qpn) };
	void *sealed;
	size_t n;
	int sent = 0;

	if (shift_kv_seal(r->kv, key, val, len, &sealed, &n))
		return 0;
	if (n <= sizeof(msg) - sizeof(h)) {
		h.len = htobe16((uint16_t)n);
		memcpy(h.src_gid, &q->my_key.gid, sizeof(h.src_gid));
		memcpy(msg, &h, sizeof(h));
		memcpy(msg + sizeof(h), sealed, n);
		/* (not into a port that is down: nothing to gain, and on the
		 * testbed's virtio NICs a queue fed while the link is down is
		 * what has left a rail dead after it came back) */
		bool up[SHIFT_SVC_PATHS] = { fo_bk_port_active(s, d), fo_port_active(s, d) };

		for (int p = 0; p < SHIFT_SVC_PATHS; p++)
			if (q->svc_ok[p] && up[p] &&
			    !shift_svc_send(r, (enum shift_svc_path)p, &q->svc_ah[p],
					    p == SHIFT_SVC_BACKUP ? q->peer_bk.svc : q->peer_bk.dsvc,
					    msg, sizeof(h) + n)) {
				__atomic_fetch_add(&shift_stats.dgrams_sent, 1, __ATOMIC_RELAXED);
				sent++;
			}
	}
	free(sealed);
	return sent;
}

/*
 * A failover about to start on a trigger surely the path's (d's port went
 * down, fo/background.c): my record of it, as it reads once started, goes
 * to the peer now, ahead of the start itself (the stop, the drain, the
 * reposting: milliseconds under emulation). The peer's Default-state QP
 * joins it as it joins any record of a failover it has not seen (take()),
 * so its own stop and drain run beside mine, not after my handshake
 * message reached it; each end sends its message when ready, as two ends
 * that fail at once do. Only where my record of the start is known now: a
 * first start of an episode (my backup armed for it, not failed), no SRQ
 * (whose QPs move together), the backup channel up with half its sends
 * free (the rest for the pass's own records: a dead NIC fails all its QPs
 * over in one pass). This record is not written to the store: a datagram
 * lost leaves the peer to my handshake message, as before. A start that
 * gives up after it tells the peer (port_fail_over: ABORT). true if sent.
 */
bool fo_dgram_starting(struct shift_ctx *s, struct shift_dqp *d)
{
	struct shift_rnic *r = s->rnic;
	struct shift_qp *q = d->shadow;
	char key[SHIFT_EXCHANGE_KEY_MAX], val[SHIFT_KV_SLOT_VAL];

	if (!r || !r->kv || !q || !d->scq || !d->rcq || d->dsrq || d->need_rearm || d->bk_error ||
	    shift_dqp_send_state(d) != SHIFT_SEND_DEFAULT || !q->svc_ok[SHIFT_SVC_BACKUP] ||
	    !q->peer_bk.has_svc || !fo_bk_port_active(s, d) ||
	    shift_svc_room(r, SHIFT_SVC_BACKUP) <= SHIFT_SVC_SENDS / 2 ||
	    __atomic_load_n(&q->state, __ATOMIC_ACQUIRE) != SHIFT_SHADOW_READY ||
	    shift_exchange_ep_key(&q->my_key, key, sizeof(key)) < 0)
		return false;
	struct shift_ep_value ev = {
		.gen = d->bk_gen, .started = (unsigned)d->failovers + 1, .count = d->ret_count,
		.nosend = !fo_app_sends(s, d), .seq = ++d->ep_seq,
	};
	int n = shift_exchange_ep_encode_ex(&ev, val, sizeof(val));

	return n > 0 && send_one(s, d, key, val, (unsigned)n) > 0;
}

/* Is a datagram from channel src_qp on path p with header h one of d's
 * peer's? */
static bool from_peer(const struct shift_dqp *d, enum shift_svc_path p, const struct dgram_hdr *h,
		      uint32_t src_qp)
{
	const struct shift_qp *q = d->shadow;

	return q && d->scq && q->peer_bk.has_svc && src_qp &&
	       src_qp == (p == SHIFT_SVC_BACKUP ? q->peer_bk.svc : q->peer_bk.dsvc) &&
	       q->peer_key.qpn == h->src_qpn &&
	       !memcmp(&q->peer_key.gid, h->src_gid, sizeof(h->src_gid));
}

/* A peer's record d took (its CQs locked): followed as a read of the
 * store's would be. */
static void take(struct shift_ctx *s, struct shift_dqp *d, const void *v, size_t len)
{
	if (shift_dqp_send_state(d) == SHIFT_SEND_DEFAULT &&
	    shift_dqp_recv_state(d) == SHIFT_RECV_DEFAULT) {
		/* (as a poke read's: one not re-armed yet joins nothing) */
		if (!fo_ep_take(d, v, len) || d->need_rearm || d->peer_join ||
		    d->peer_started <= d->failovers)
			return;
		/* (a QP on an SRQ joins only a lone end's failover, whose backup
		 * failed: its start moves the whole SRQ, which a start its peer
		 * may still give up must not cost it; its peer's handshake
		 * message starts it, as before) */
		if (d->dsrq && !d->peer_bkfail)
			return;
		__atomic_store_n(&d->peer_join, true, __ATOMIC_RELEASE);
		shift_ctx_set_slow(s, true);
	} else if (fo_ep_take(d, v, len)) {
		d->kv_pref = 1; /* (followed at this pass or the next) */
	}
}

static void rx(void *arg, enum shift_svc_path p, uint32_t src_qp, const void *msg, size_t len)
{
	struct shift_ctx *s = arg;
	struct dgram_hdr h;
	struct shift_dqp *d;
	char key[SHIFT_EXCHANGE_KEY_MAX];
	size_t vlen;
	void *v;

	if (len < sizeof(h))
		goto refused;
	memcpy(&h, msg, sizeof(h));
	h.magic = be32toh(h.magic);
	h.kind = be16toh(h.kind);
	h.len = be16toh(h.len);
	h.dst_qpn = be32toh(h.dst_qpn);
	h.src_qpn = be32toh(h.src_qpn);
	d = shift_dqp_by_qpn(s, h.dst_qpn);
	if (h.magic != DGRAM_MAGIC || h.kind != DGRAM_EP || h.len != len - sizeof(h) || !d ||
	    !from_peer(d, p, &h, src_qp) ||
	    shift_exchange_ep_key(&d->shadow->peer_key, key, sizeof(key)) < 0)
		goto refused;
	vlen = h.len;
	v = malloc(vlen + 1);
	if (!v)
		return;
	memcpy(v, (const uint8_t *)msg + sizeof(h), vlen);
	((char *)v)[vlen] = '\0';
	if (shift_kv_unseal(s->rnic->kv, key, &v, &vlen))
		goto refused; /* (freed) */
	shift_debug("%s QP %u: the peer's record as a datagram: %.*s", d->dev, d->qpn, (int)vlen,
		    (const char *)v);
	fo_lock_cqs(d);
	take(s, d, v, vlen);
	fo_unlock_cqs(d);
	free(v);
	__atomic_fetch_add(&shift_stats.dgrams_taken, 1, __ATOMIC_RELAXED);
	return;
refused:
	__atomic_fetch_add(&shift_stats.dgrams_refused, 1, __ATOMIC_RELAXED);
}

/* The pass's datagrams (its KV share, fo/kvq.c; slow_lock held): the
 * records collected sent, the peers' taken. */
void fo_dgram_run(struct shift_ctx *s)
{
	for (unsigned k = 0; k < nout; k++) {
		struct shift_dqp *d = fo_dqp_again(s, out[k].d, out[k].qpn, out[k].serial);

		if (d && d->shadow)
			send_one(s, d, out[k].key, out[k].val, out[k].len);
	}
	nout = 0;
	shift_svc_poll(s->rnic, rx, s);
}
