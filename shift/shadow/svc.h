/*
 * The service channels: one UD QP per RNIC on its backup NIC and one on
 * its default NIC, through which the background passes of two processes
 * send each other small datagrams that must not wait for the KV store
 * (episode records, shift/fo/dgram.c). UD has no connection, so no
 * generation: a backup RC QP reset for a new failover cannot take a
 * datagram for one of the old QP's packets, which is what keeps that
 * agreement off the backup QPs themselves. The backup channel carries it
 * while the default path is down (a second failover of one episode, a
 * failover one end missed); the default channel while the backup path is
 * (a return to the default QPs after a backup failure).
 *
 * Each channel's QPN is in every QP record the RNIC writes
 * (shift_qp_value.svc, .dsvc); a peer is reached at its QP's backup path
 * or at its default path (the address handles made when the backup QP
 * connects, shift_svc_peer). Datagrams are lossy: one lost is sent again
 * by its sender's own schedule. A channel only carries bytes; what they
 * say is checked by the layer that reads them. A channel whose QP failed
 * (its port went down under it, on some providers) is brought back at the
 * next poll. Everything here runs on the RNIC's thread (or the inline
 * passes), like the KV handle. No channel (SHIFT_DATAGRAMS=0, a NIC that
 * refuses a UD QP) leaves the KV store as the only way, with one log line.
 */
#ifndef SHIFT_SHADOW_SVC_H
#define SHIFT_SHADOW_SVC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <infiniband/verbs.h>

struct shift_rnic;

enum shift_svc_path { SHIFT_SVC_BACKUP, SHIFT_SVC_DEFAULT, SHIFT_SVC_PATHS };

#define SHIFT_SVC_QKEY 0x5348dd01u
#define SHIFT_SVC_MSG_MAX 256u /* bytes of a datagram's message */
#define SHIFT_SVC_SENDS 32u    /* datagrams a channel has in flight at most */

/* Open r's channels (r->svc[]; those that cannot be opened: none, said). */
void shift_svc_open(struct shift_rnic *r);
/* Close them (after the thread stopped; before the backup CQs' channel). */
void shift_svc_close(struct shift_rnic *r);
/* A channel's QPN (0: none). */
uint32_t shift_svc_qpn(const struct shift_rnic *r, enum shift_svc_path p);
/* An address handle on channel p for ah (a QP's path to its peer), made
 * now so that no send waits for one: false if it cannot be made (the
 * QP's datagrams then do not go that way). */
bool shift_svc_peer(struct shift_rnic *r, enum shift_svc_path p, const struct ibv_ah_attr *ah);
/* Send msg (len <= SHIFT_SVC_MSG_MAX) on channel p to the peer's channel
 * qpn at ah: 0, or -1 if it could not go (no channel or address handle,
 * the queue full). */
int shift_svc_send(struct shift_rnic *r, enum shift_svc_path p, const struct ibv_ah_attr *ah,
		   uint32_t qpn, const void *msg, size_t len);
/* How many more datagrams channel p can take now, of SHIFT_SVC_SENDS (0:
 * no working channel). */
unsigned shift_svc_room(const struct shift_rnic *r, enum shift_svc_path p);
/* Every datagram received on either channel since the last call, to fn
 * (the channel, the sender's QPN, the message); the CQs armed again. */
void shift_svc_poll(struct shift_rnic *r,
		    void (*fn)(void *arg, enum shift_svc_path p, uint32_t src_qp, const void *msg,
			       size_t len),
		    void *arg);
/* The default channel's completion events, for the thread's wait (-1:
 * none; its backup channel's are the backup CQs', r->bk_ev), and their
 * acknowledgement once it woke. */
int shift_svc_fd(const struct shift_rnic *r);
void shift_svc_drain(struct shift_rnic *r);

#endif /* SHIFT_SHADOW_SVC_H */
