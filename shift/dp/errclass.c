/*
 * The error classification (errclass.h). Reasons per status: the table in
 * docs/failover.md; the facts behind them come from the IBA's error
 * classes and from what rxe (drivers/infiniband/sw/rxe) and mlx5
 * (providers/mlx5/cq.c) report for each.
 */
#include "shift/dp/errclass.h"

enum shift_wc_class shift_wc_class(enum ibv_wc_status status)
{
	switch (status) {
	case IBV_WC_SUCCESS:
		return SHIFT_WC_OK;
	case IBV_WC_WR_FLUSH_ERR:
		return SHIFT_WC_FLUSH;
	/* the transport gave up on the path: no ACK within the retry budget
	 * (RETRY_EXC), a response timeout; a device that failed under the
	 * QP (FATAL_ERR: bnxt_re's hardware flush, rxe's read response to a
	 * WR that is no read, iWARP protocol errors) */
	case IBV_WC_RETRY_EXC_ERR:
	case IBV_WC_RESP_TIMEOUT_ERR:
	case IBV_WC_FATAL_ERR:
		return SHIFT_WC_PATH;
	/* the application's: a WR or buffer it gave (local length,
	 * protection, access, QP operation, memory window), its peer's
	 * (remote access, invalid request, remote operation, receives not
	 * posted in time: RNR retry exceeded, a response the responder
	 * should not have sent), RD-only statuses never seen on RC, tag
	 * matching, and GENERAL_ERR, the provider's "none of these"
	 * (mlx5's unknown syndromes): nothing says the path failed */
	case IBV_WC_LOC_LEN_ERR:
	case IBV_WC_LOC_QP_OP_ERR:
	case IBV_WC_LOC_EEC_OP_ERR:
	case IBV_WC_LOC_PROT_ERR:
	case IBV_WC_MW_BIND_ERR:
	case IBV_WC_BAD_RESP_ERR:
	case IBV_WC_LOC_ACCESS_ERR:
	case IBV_WC_REM_INV_REQ_ERR:
	case IBV_WC_REM_ACCESS_ERR:
	case IBV_WC_REM_OP_ERR:
	case IBV_WC_RNR_RETRY_EXC_ERR:
	case IBV_WC_LOC_RDD_VIOL_ERR:
	case IBV_WC_REM_INV_RD_REQ_ERR:
	case IBV_WC_REM_ABORT_ERR:
	case IBV_WC_INV_EECN_ERR:
	case IBV_WC_INV_EEC_STATE_ERR:
	case IBV_WC_GENERAL_ERR:
	case IBV_WC_TM_ERR:
	case IBV_WC_TM_RNDV_INCOMPLETE:
		return SHIFT_WC_APP;
	}
	/* a status newer than this table: not known to be a path failure */
	return SHIFT_WC_APP;
}

const char *shift_wc_class_name(enum shift_wc_class c)
{
	switch (c) {
	case SHIFT_WC_OK:
		return "ok";
	case SHIFT_WC_PATH:
		return "path";
	case SHIFT_WC_FLUSH:
		return "flush";
	case SHIFT_WC_APP:
		return "application";
	}
	return "?";
}
