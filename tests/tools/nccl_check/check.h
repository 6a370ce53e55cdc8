/* check.h - the pure verification core of shift-nccl-check.
 *
 * Everything here is plain memory arithmetic with no verbs and no I/O, so the
 * unit tests (tests/unit/test_check.c) can prove it on any machine:
 *   - the data pattern: every byte of message `seq` on stream `key` is derived
 *     from (key, seq, byte offset), so a receiver can verify any byte without
 *     a copy of what was sent, and a stale, misplaced or foreign buffer fails;
 *   - the notification accountant: classifies each arriving sequence number
 *     as new, late (out of order) or duplicate, and counts the missing ones;
 *   - the credit word: a 32-bit counter with its complement in the high half,
 *     so a poller of RDMA-written memory can reject a torn 8-byte write.
 */
#ifndef SHIFT_TOOLS_CHECK_H
#define SHIFT_TOOLS_CHECK_H

#include <stddef.h>
#include <stdint.h>

/* ---- data pattern ---- */

/* The 64-bit pattern word at word index `widx` of message `seq` on `key`. */
uint64_t check_pattern_word(uint64_t key, uint64_t seq, uint64_t widx);

/* Fill buf with bytes [msg_off, msg_off+len) of message (key, seq). */
void check_pattern_fill(void *buf, size_t len, uint64_t key, uint64_t seq,
                        size_t msg_off);

struct check_mismatch {
	size_t count;     /* bytes that differ */
	size_t first_off; /* message offset of the first differing byte */
	uint8_t expected; /* its expected value */
	uint8_t got;      /* what the buffer held */
};

/* Verify buf against bytes [msg_off, msg_off+len) of message (key, seq).
 * Returns the number of wrong bytes (0 = clean); fills *mm if non-NULL. */
size_t check_pattern_verify(const void *buf, size_t len, uint64_t key,
                            uint64_t seq, size_t msg_off,
                            struct check_mismatch *mm);

/* The stream key of queue pair `qp` in direction `dir` (0 = client to
 * server, 1 = server to client): distinct streams never verify as each other. */
static inline uint64_t check_stream_key(unsigned qp, unsigned dir)
{
	return 0x5348494654000000ull | ((uint64_t)qp << 8) | (dir & 1u);
}

/* ---- notification accounting ---- */

#define CHECK_SEQ_WINDOW 4096u /* sequence numbers tracked beyond the base */
#define CHECK_SEQ_EVENTS 8u    /* anomalies remembered for the report */

enum check_seq_verdict {
	CHECK_SEQ_NEW,   /* first arrival, in order */
	CHECK_SEQ_LATE,  /* first arrival, after a higher seq (out of order) */
	CHECK_SEQ_DUP,   /* seen before (or so old it was already settled) */
};

struct check_seq_event {
	char kind; /* 'd' duplicate, 'o' out of order, 'm' missing, 'u' unexpected */
	uint64_t seq;
};

/* Invariant: every seq below `base` is settled (seen, or counted missing);
 * bits[] holds "seen" for [base, base + CHECK_SEQ_WINDOW), indexed seq % W,
 * and is clear for every position outside that range. */
struct check_seq {
	uint64_t base;
	uint64_t max_seen1;    /* highest seq seen + 1; 0 before the first */
	uint64_t received;     /* distinct sequence numbers seen */
	uint64_t duplicate;
	uint64_t out_of_order;
	uint64_t missing;      /* settled as never seen (window slide, finish) */
	uint64_t unexpected;   /* seen but >= the total the peer says it sent */
	unsigned nevents;
	struct check_seq_event events[CHECK_SEQ_EVENTS];
	uint64_t bits[CHECK_SEQ_WINDOW / 64];
};

void check_seq_init(struct check_seq *s);
enum check_seq_verdict check_seq_note(struct check_seq *s, uint64_t seq);
/* The peer says it sent `total` (seqs 0..total-1): count the unseen ones as
 * missing and the seen ones beyond as unexpected. Call once, at the end. */
void check_seq_finish(struct check_seq *s, uint64_t total);
/* missing + duplicate + out_of_order + unexpected */
uint64_t check_seq_violations(const struct check_seq *s);

/* Widen a 32-bit sequence number (an immediate) to 64 bits, choosing the
 * value nearest `ref` (the next expected seq). */
static inline uint64_t check_seq_widen(uint64_t ref, uint32_t low)
{
	int32_t d = (int32_t)(low - (uint32_t)ref);
	if (d < 0 && (uint64_t)(-(int64_t)d) > ref)
		return low; /* would go below zero: take it literally */
	return (uint64_t)((int64_t)ref + d);
}

/* ---- credit / ready words ---- */

static inline uint64_t check_counter_encode(uint32_t c)
{
	return ((uint64_t)(uint32_t)~c << 32) | c;
}

/* 1 and *c set if w is a whole encoded counter, 0 if torn or unwritten. */
static inline int check_counter_decode(uint64_t w, uint32_t *c)
{
	uint32_t lo = (uint32_t)w, hi = (uint32_t)(w >> 32);
	if (hi != (uint32_t)~lo)
		return 0;
	*c = lo;
	return 1;
}

#endif
