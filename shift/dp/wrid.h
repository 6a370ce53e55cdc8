/*
 * The wr_ids SHIFT gives its own work requests and the application's WRs it
 * posts again (on the backup QP, or on the default QP while failed over).
 */
#ifndef SHIFT_DP_WRID_H
#define SHIFT_DP_WRID_H

#include <stdint.h>

/* wr_ids of what SHIFT posts on a backup QP (it posts nothing else there) */
#define SHIFT_WRID_CTRL_RECV 0x7ff0000000000001ull
#define SHIFT_WRID_CTRL_SEND 0x7ff0000000000002ull
/*
 * SHIFT's own WRs on the application's default QP while it is failed over
 * (their completions come on the application's CQs): the notification's
 * receive, the recovery probe, the failback notification and the empty RDMA
 * READ that may go ahead of it (dflt_rd_stale). No wr_id value is SHIFT's
 * there: each carries its QP's own tag (a hash of its device and QP number,
 * shift_dqp_own_wrid()) and its kind in the low 4 bits. (On the backup QP,
 * SHIFT's alone, the constants above and SHIFT_WRID_DATA apply.)
 */
enum {
	SHIFT_OWN_CTRL_RECV = 1,
	SHIFT_OWN_PROBE = 3,
	SHIFT_OWN_NOTIFY = 4,
	SHIFT_OWN_NOTIFY_READ = 5,
};
#define SHIFT_WRID_DATA (1ull << 63)      /* | RECV | mirror index */
#define SHIFT_WRID_RECV (1ull << 62)
#define SHIFT_WRID_INDEX(w) ((w) & ((1ull << 48) - 1))
/* ... | RECV | BOUNCE | slot: SHIFT's own receive of a QP on an SRQ */
#define SHIFT_WRID_BOUNCE (1ull << 47)
/* the backup QP's generation (resets) a WR was posted in: completions of an
 * earlier one (flushes of a reset, late) are told apart from the current */
#define SHIFT_WRID_GEN(g) ((uint64_t)((g) & 0x3fffu) << 48)
#define SHIFT_WRID_GEN_OF(w) ((unsigned)((w) >> 48) & 0x3fffu)

#endif /* SHIFT_DP_WRID_H */
