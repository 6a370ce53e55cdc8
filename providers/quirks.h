/*
 * Provider quirks SHIFT has to know about. Everything provider-specific
 * lives under providers/; the rest of SHIFT asks through these functions.
 */
#ifndef SHIFT_PROVIDERS_QUIRKS_H
#define SHIFT_PROVIDERS_QUIRKS_H

#include <stdint.h>
#include <infiniband/verbs.h>

/*
 * The retry_cnt SHIFT gives a QP the application asked retry_cnt `want` for.
 * The IB spec's 7 means seven retries (only rnr_retry 7 means "forever"),
 * but soft-RoCE (rxe) never decrements a retry_cnt of 7: a dead peer or
 * link then never produces an error completion, and SHIFT could not see the
 * failure it exists to hide. On rxe 7 becomes 6 (the spec's meaning, one
 * retry shorter); everywhere else `want` is returned unchanged.
 */
uint8_t shift_provider_retry_cnt(struct ibv_context *ctx, uint8_t want);

/* Is this context a soft-RoCE (rdma_rxe) device? Cached per context. */
int shift_provider_is_rxe(struct ibv_context *ctx);

#endif /* SHIFT_PROVIDERS_QUIRKS_H */
