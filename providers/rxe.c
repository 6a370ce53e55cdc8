/*
 * Soft-RoCE (rdma_rxe): the kernel's software RoCE device, the testbed's.
 *
 * Its quirks SHIFT has to know:
 * - retry_cnt 7: the IB spec's 7 means seven retries (only rnr_retry 7
 *   means "forever"), but rxe never decrements a retry_cnt of 7: a dead
 *   peer or link then never produces an error completion, and SHIFT could
 *   not see the failure it exists to hide. SHIFT asks for 6 instead (the
 *   spec's meaning, one retry shorter).
 * - Its completer keeps a read-response state across a QP reset (handled
 *   for every provider by the failover layer: an empty RDMA READ goes first
 *   on a QP reset inside a read response, shift/fo/failback.c).
 * Work queues: rxe's are shared with the kernel in its own format; SHIFT
 * keeps its mirror.
 */
#include "providers/provider.h"
#include "shift/base/log.h"

/* rdma_rxe reports this vendor id (the kernel's RXE_VENDOR_ID) */
#define RXE_VENDOR_ID 0xffffff

static bool rxe_match(const struct ibv_device_attr *attr)
{
	return attr->vendor_id == RXE_VENDOR_ID && attr->vendor_part_id == 0;
}

static uint8_t rxe_retry_cnt(const char *dev, uint8_t want)
{
	static int logged;

	if (want < 7)
		return want;
	if (!__atomic_exchange_n(&logged, 1, __ATOMIC_RELAXED))
		shift_info("%s: retry_cnt 7 becomes 6 on soft-RoCE, which would retry a dead path "
			   "forever and never report the failure", dev);
	return 6;
}

const struct shift_provider shift_provider_rxe = {
	.name = "rxe",
	.match = rxe_match,
	.retry_cnt = rxe_retry_cnt,
	.wq = SHIFT_WQ_MIRROR,
};
