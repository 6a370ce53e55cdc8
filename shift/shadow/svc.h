/*
 * The service channel: one UD QP per RNIC on its backup NIC, through which
 * the background passes of two processes send each other small datagrams
 * that must not wait for the KV store (episode records, shift/fo/dgram.c).
 * UD has no connection, so no generation: a backup RC QP reset for a new
 * failover cannot take a datagram for one of the old QP's packets, which
 * is what keeps that agreement off the backup QPs themselves.
 *
 * The channel's QPN is in every QP record the RNIC writes
 * (shift_qp_value.svc); a peer is reached at its QP's backup path (the
 * address handle made when the backup QP connects, shift_svc_peer). It is
 * lossy: a datagram lost is sent again by its sender's own schedule. The
 * channel only carries bytes; what they say is checked by the layer that
 * reads them. Everything here runs on the RNIC's thread (or the inline
 * passes), like the KV handle. No channel (the backup NIC refuses a UD QP)
 * leaves the KV store as the only way, with one log line.
 */
#ifndef SHIFT_SHADOW_SVC_H
#define SHIFT_SHADOW_SVC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <infiniband/verbs.h>

struct shift_rnic;

#define SHIFT_SVC_QKEY 0x5348dd01u
#define SHIFT_SVC_MSG_MAX 256u /* bytes of a datagram's message */

/* Open r's channel on its backup NIC (r->svc; false: none, said once). */
bool shift_svc_open(struct shift_rnic *r);
/* Close it (after the thread stopped; before the backup CQs' channel). */
void shift_svc_close(struct shift_rnic *r);
/* Its QPN (0: no channel). */
uint32_t shift_svc_qpn(const struct shift_rnic *r);
/* An address handle for ah (a QP's backup path), made now so that no send
 * waits for one: false if it cannot be made (the QP's datagrams then go
 * nowhere; the KV store still carries its records). */
bool shift_svc_peer(struct shift_rnic *r, const struct ibv_ah_attr *ah);
/* Send msg (len <= SHIFT_SVC_MSG_MAX) to the channel qpn at ah: 0, or -1
 * if it could not go (no channel, no address handle, the queue full). */
int shift_svc_send(struct shift_rnic *r, const struct ibv_ah_attr *ah, uint32_t qpn,
		   const void *msg, size_t len);
/* Every datagram received since the last call, to fn (the sender's QPN,
 * the message); the CQ armed again. The number of datagrams. */
unsigned shift_svc_poll(struct shift_rnic *r,
			void (*fn)(void *arg, uint32_t src_qp, const void *msg, size_t len),
			void *arg);

#endif /* SHIFT_SHADOW_SVC_H */
