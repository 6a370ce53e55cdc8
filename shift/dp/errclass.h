/*
 * Which completion errors are failures of the path (SHIFT fails the QP over
 * and hides them) and which are the application's (they reach it exactly as
 * without SHIFT, and the QP stops being protected). One pure function over
 * every enum ibv_wc_status value; docs/failover.md ("Error classification")
 * has the table with the reason for each.
 */
#ifndef SHIFT_DP_ERRCLASS_H
#define SHIFT_DP_ERRCLASS_H

#include <infiniband/verbs.h>

enum shift_wc_class {
	SHIFT_WC_OK,    /* success */
	/* a transport failure of the path or the device under it: the QP
	 * fails over (IBV_WC_RETRY_EXC_ERR and kin) */
	SHIFT_WC_PATH,
	/* a flush: a consequence, never a cause. The QP's first error, or
	 * the reason it went to ERR without one, decides (fo/poll.c) */
	SHIFT_WC_FLUSH,
	/* caused by the application or its peer's application (a bad key,
	 * a buffer too small, receives not posted in time...), or not known
	 * to be a path failure: as without SHIFT */
	SHIFT_WC_APP,
};

enum shift_wc_class shift_wc_class(enum ibv_wc_status status);
const char *shift_wc_class_name(enum shift_wc_class c);

#endif /* SHIFT_DP_ERRCLASS_H */
