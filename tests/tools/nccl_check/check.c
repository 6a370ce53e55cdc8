/* check.c - pattern generation/verification and notification accounting for
 * shift-nccl-check (see check.h). Pure C: no verbs, no I/O, no allocation. */
#include "check.h"

#include <string.h>

/* A strong 64-bit mixer (the splitmix64 finaliser constants). */
static inline uint64_t mix64(uint64_t z)
{
	z += 0x9e3779b97f4a7c15ull;
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

static inline uint64_t msg_base(uint64_t key, uint64_t seq)
{
	return mix64(mix64(key) ^ (seq * 0xd6e8feb86659fd93ull));
}

uint64_t check_pattern_word(uint64_t key, uint64_t seq, uint64_t widx)
{
	return mix64(msg_base(key, seq) + widx);
}

/* Byte `off` of the message whose per-message base is `b`: byte off%8 of the
 * word off/8, little-endian, whatever the host order. */
static inline uint8_t pattern_byte(uint64_t b, size_t off)
{
	return (uint8_t)(mix64(b + off / 8) >> (8 * (off % 8)));
}

static inline void put_le64(uint8_t *p, uint64_t w)
{
	for (int i = 0; i < 8; i++)
		p[i] = (uint8_t)(w >> (8 * i));
}

static inline uint64_t get_le64(const uint8_t *p)
{
	uint64_t w = 0;
	for (int i = 0; i < 8; i++)
		w |= (uint64_t)p[i] << (8 * i);
	return w;
}

void check_pattern_fill(void *buf, size_t len, uint64_t key, uint64_t seq,
                        size_t msg_off)
{
	uint8_t *p = buf;
	uint64_t b = msg_base(key, seq);
	size_t off = msg_off, end = msg_off + len;

	while (off < end && off % 8) /* unaligned head */
		*p++ = pattern_byte(b, off++);
	for (; off + 8 <= end; off += 8, p += 8)
		put_le64(p, mix64(b + off / 8));
	while (off < end) /* tail */
		*p++ = pattern_byte(b, off++);
}

static void note_bad(struct check_mismatch *mm, size_t off, uint8_t exp,
                     uint8_t got)
{
	if (mm->count++ == 0) {
		mm->first_off = off;
		mm->expected = exp;
		mm->got = got;
	}
}

size_t check_pattern_verify(const void *buf, size_t len, uint64_t key,
                            uint64_t seq, size_t msg_off,
                            struct check_mismatch *out)
{
	const uint8_t *p = buf;
	uint64_t b = msg_base(key, seq);
	size_t off = msg_off, end = msg_off + len;
	struct check_mismatch mm = {0};

	while (off < end && off % 8) {
		uint8_t e = pattern_byte(b, off);
		if (*p != e)
			note_bad(&mm, off, e, *p);
		p++, off++;
	}
	for (; off + 8 <= end; off += 8, p += 8) {
		uint64_t e = mix64(b + off / 8), g = get_le64(p);
		if (e == g)
			continue;
		for (int i = 0; i < 8; i++) {
			uint8_t eb = (uint8_t)(e >> (8 * i)), gb = p[i];
			if (eb != gb)
				note_bad(&mm, off + i, eb, gb);
		}
	}
	while (off < end) {
		uint8_t e = pattern_byte(b, off);
		if (*p != e)
			note_bad(&mm, off, e, *p);
		p++, off++;
	}
	if (out)
		*out = mm;
	return mm.count;
}

/* ---- notification accounting ---- */

#define W CHECK_SEQ_WINDOW

static inline int bit_get(const struct check_seq *s, uint64_t seq)
{
	return (s->bits[(seq % W) / 64] >> (seq % 64)) & 1;
}

static inline void bit_set(struct check_seq *s, uint64_t seq)
{
	s->bits[(seq % W) / 64] |= 1ull << (seq % 64);
}

static inline void bit_clear(struct check_seq *s, uint64_t seq)
{
	s->bits[(seq % W) / 64] &= ~(1ull << (seq % 64));
}

static void event(struct check_seq *s, char kind, uint64_t seq)
{
	if (s->nevents < CHECK_SEQ_EVENTS)
		s->events[s->nevents++] = (struct check_seq_event){kind, seq};
}

void check_seq_init(struct check_seq *s)
{
	memset(s, 0, sizeof(*s));
}

/* Settle `base`: count it missing if unseen, clear its bit, move on. */
static void settle_one(struct check_seq *s)
{
	if (!bit_get(s, s->base)) {
		s->missing++;
		event(s, 'm', s->base);
	}
	bit_clear(s, s->base);
	s->base++;
}

/* Slide the window so that `seq` fits in [base, base + W). */
static void slide_to(struct check_seq *s, uint64_t seq)
{
	if (seq - s->base >= 2ull * W) {
		/* Far jump: the whole window and the gap after it are settled. */
		uint64_t seen = 0;
		for (unsigned i = 0; i < W / 64; i++)
			seen += (uint64_t)__builtin_popcountll(s->bits[i]);
		uint64_t newbase = seq - W + 1;
		s->missing += (newbase - s->base) - seen;
		event(s, 'm', s->base);
		memset(s->bits, 0, sizeof(s->bits));
		s->base = newbase;
		return;
	}
	while (seq >= s->base + W)
		settle_one(s);
}

enum check_seq_verdict check_seq_note(struct check_seq *s, uint64_t seq)
{
	/* Below the base everything is settled; inside the window the bit
	 * tells; beyond the window nothing has been seen yet. */
	if (seq < s->base || (seq < s->base + W && bit_get(s, seq))) {
		s->duplicate++;
		event(s, 'd', seq);
		return CHECK_SEQ_DUP;
	}
	slide_to(s, seq);
	bit_set(s, seq);
	s->received++;

	enum check_seq_verdict v = CHECK_SEQ_NEW;
	if (seq + 1 <= s->max_seen1) {
		s->out_of_order++;
		event(s, 'o', seq);
		v = CHECK_SEQ_LATE;
	} else {
		s->max_seen1 = seq + 1;
	}
	/* Advance the base over the contiguous seen prefix. */
	while (bit_get(s, s->base) && s->base < s->max_seen1) {
		bit_clear(s, s->base);
		s->base++;
	}
	return v;
}

void check_seq_finish(struct check_seq *s, uint64_t total)
{
	/* Seen seqs at or beyond total were never sent. */
	uint64_t lim = s->max_seen1 < s->base + W ? s->max_seen1 : s->base + W;
	for (uint64_t q = total > s->base ? total : s->base; q < lim; q++) {
		if (bit_get(s, q)) {
			s->unexpected++;
			event(s, 'u', q);
		}
	}
	if (s->max_seen1 > total && s->base > total) {
		/* Settled seqs in [total, base) were seen (or, after a wild jump,
		 * counted missing): either way a violation; count them here. */
		s->unexpected += s->base - total;
		event(s, 'u', total);
	}
	while (s->base < total && s->base < s->max_seen1)
		settle_one(s);
	if (s->base < total) { /* never reached: all missing */
		s->missing += total - s->base;
		event(s, 'm', s->base);
		s->base = total;
	}
}

uint64_t check_seq_violations(const struct check_seq *s)
{
	return s->missing + s->duplicate + s->out_of_order + s->unexpected;
}
