/* test_check.c - unit tests of shift-nccl-check's verification core
 * (tests/tools/nccl_check/check.c): a clean buffer verifies, a single wrong
 * byte anywhere is counted and located, stale/foreign/misplaced data fails,
 * and the notification accountant counts duplicate, missing, out-of-order and
 * unexpected sequence numbers exactly. Pure memory, no RDMA. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "tests/tools/nccl_check/check.h"

static const size_t sizes[] = {1, 7, 8, 9, 63, 64, 65, 4096, 65536 + 3};

static void clean_buffer_verifies(void **state)
{
	(void)state;
	for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
		size_t n = sizes[i];
		uint8_t *b = malloc(n);
		assert_non_null(b);
		for (uint64_t seq = 0; seq < 70000; seq += 9999) {
			uint64_t key = check_stream_key((unsigned)i, (unsigned)seq & 1);
			struct check_mismatch mm = {.count = 99};
			check_pattern_fill(b, n, key, seq, 0);
			assert_int_equal(check_pattern_verify(b, n, key, seq, 0, &mm), 0);
			assert_int_equal(mm.count, 0);
		}
		free(b);
	}
}

/* Every position of a buffer with an unaligned tail, two kinds of flip. */
static void single_wrong_byte_anywhere_is_counted(void **state)
{
	(void)state;
	enum { N = 1024 + 5 };
	uint8_t b[N];
	const uint64_t key = check_stream_key(3, 0), seq = 12345;
	check_pattern_fill(b, N, key, seq, 0);
	for (size_t off = 0; off < N; off++) {
		static const uint8_t flips[] = {0x01, 0xff, 0x80};
		for (size_t f = 0; f < sizeof(flips); f++) {
			uint8_t orig = b[off];
			b[off] ^= flips[f];
			struct check_mismatch mm;
			assert_int_equal(check_pattern_verify(b, N, key, seq, 0, &mm), 1);
			assert_int_equal(mm.count, 1);
			assert_int_equal(mm.first_off, off);
			assert_int_equal(mm.expected, orig);
			assert_int_equal(mm.got, (uint8_t)(orig ^ flips[f]));
			b[off] = orig;
		}
	}
	assert_int_equal(check_pattern_verify(b, N, key, seq, 0, NULL), 0);
}

static void wrong_byte_in_large_message(void **state)
{
	(void)state;
	const size_t n = 1u << 20;
	uint8_t *b = malloc(n);
	assert_non_null(b);
	const uint64_t key = check_stream_key(0, 1);
	check_pattern_fill(b, n, key, 7, 0);
	srand(42);
	for (int i = 0; i < 200; i++) {
		size_t off = (size_t)rand() % n;
		b[off] ^= 0x20;
		struct check_mismatch mm;
		assert_int_equal(check_pattern_verify(b, n, key, 7, 0, &mm), 1);
		assert_int_equal(mm.first_off, off);
		b[off] ^= 0x20;
	}
	/* Two wrong bytes in one word, one in another: three counted. */
	b[800] ^= 1, b[803] ^= 1, b[9000] ^= 4;
	struct check_mismatch mm;
	assert_int_equal(check_pattern_verify(b, n, key, 7, 0, &mm), 3);
	assert_int_equal(mm.first_off, 800);
	free(b);
}

/* Stale (older seq), foreign (other stream) and misplaced data all fail. */
static void stale_foreign_and_misplaced_data_fail(void **state)
{
	(void)state;
	enum { N = 8192 };
	static uint8_t b[N], c[N];
	const uint64_t k = check_stream_key(0, 0);
	check_pattern_fill(b, N, k, 100, 0);
	assert_true(check_pattern_verify(b, N, k, 92, 0, NULL) > N * 9 / 10);
	assert_true(check_pattern_verify(b, N, check_stream_key(0, 1), 100, 0, NULL) > N * 9 / 10);
	assert_true(check_pattern_verify(b, N, check_stream_key(1, 0), 100, 0, NULL) > N * 9 / 10);
	/* Two chunks swapped: every byte of both is wrong at its offset. */
	memcpy(c, b, N);
	memcpy(c, b + 4096, 4096);
	memcpy(c + 4096, b, 4096);
	assert_true(check_pattern_verify(c, N, k, 100, 0, NULL) > N * 9 / 10);
	/* A zeroed (never written) chunk fails too. */
	memcpy(c, b, N);
	memset(c + 1024, 0, 1024);
	assert_true(check_pattern_verify(c, N, k, 100, 0, NULL) > 1000);
}

/* Filling in chunks at any offsets equals filling the whole message, and a
 * chunk verifies on its own at its message offset. */
static void chunked_fill_matches_whole(void **state)
{
	(void)state;
	enum { N = 10000 };
	static uint8_t whole[N], parts[N];
	const uint64_t k = check_stream_key(5, 1);
	check_pattern_fill(whole, N, k, 3, 0);
	static const size_t cuts[] = {0, 1, 13, 16, 4000, 4003, 8192, 9999, N};
	for (size_t i = 0; i + 1 < sizeof(cuts) / sizeof(cuts[0]); i++) {
		check_pattern_fill(parts + cuts[i], cuts[i + 1] - cuts[i], k, 3, cuts[i]);
		assert_int_equal(check_pattern_verify(whole + cuts[i], cuts[i + 1] - cuts[i],
		                                      k, 3, cuts[i], NULL), 0);
	}
	assert_memory_equal(whole, parts, N);
	/* Bytes are the little-endian pattern words. */
	for (uint64_t w = 0; w < N / 8; w += 97) {
		uint64_t x = check_pattern_word(k, 3, w);
		for (int j = 0; j < 8; j++)
			assert_int_equal(whole[w * 8 + j], (uint8_t)(x >> (8 * j)));
	}
}

/* ---- notification accounting ---- */

static void in_order_is_clean(void **state)
{
	(void)state;
	struct check_seq s;
	check_seq_init(&s);
	for (uint64_t q = 0; q < 100000; q++)
		assert_int_equal(check_seq_note(&s, q), CHECK_SEQ_NEW);
	check_seq_finish(&s, 100000);
	assert_int_equal(s.received, 100000);
	assert_int_equal(check_seq_violations(&s), 0);
	assert_int_equal(s.nevents, 0);
}

static void duplicate_is_counted(void **state)
{
	(void)state;
	struct check_seq s;
	check_seq_init(&s);
	for (uint64_t q = 0; q < 10; q++)
		check_seq_note(&s, q);
	assert_int_equal(check_seq_note(&s, 5), CHECK_SEQ_DUP);
	assert_int_equal(check_seq_note(&s, 9), CHECK_SEQ_DUP); /* the latest, too */
	check_seq_note(&s, 10);
	check_seq_finish(&s, 11);
	assert_int_equal(s.duplicate, 2);
	assert_int_equal(s.missing, 0);
	assert_int_equal(s.out_of_order, 0);
	assert_int_equal(s.received, 11);
	assert_int_equal(check_seq_violations(&s), 2);
	assert_int_equal(s.events[0].kind, 'd');
	assert_int_equal(s.events[0].seq, 5);

	/* A duplicate of something still inside the window, behind a gap. */
	check_seq_init(&s);
	check_seq_note(&s, 0);
	check_seq_note(&s, 2);
	assert_int_equal(check_seq_note(&s, 2), CHECK_SEQ_DUP);
	assert_int_equal(s.duplicate, 1);
}

static void missing_is_counted(void **state)
{
	(void)state;
	struct check_seq s;
	check_seq_init(&s);
	for (uint64_t q = 0; q < 10; q++)
		if (q != 4)
			check_seq_note(&s, q);
	check_seq_finish(&s, 12); /* 4 lost in the middle, 10 and 11 at the tail */
	assert_int_equal(s.missing, 3);
	assert_int_equal(s.duplicate, 0);
	assert_int_equal(s.out_of_order, 0);
	assert_int_equal(s.events[0].kind, 'm');
	assert_int_equal(s.events[0].seq, 4);

	/* Nothing arrived at all. */
	check_seq_init(&s);
	check_seq_finish(&s, 5);
	assert_int_equal(s.missing, 5);
}

static void out_of_order_is_counted(void **state)
{
	(void)state;
	struct check_seq s;
	check_seq_init(&s);
	assert_int_equal(check_seq_note(&s, 0), CHECK_SEQ_NEW);
	assert_int_equal(check_seq_note(&s, 1), CHECK_SEQ_NEW);
	assert_int_equal(check_seq_note(&s, 3), CHECK_SEQ_NEW);
	assert_int_equal(check_seq_note(&s, 2), CHECK_SEQ_LATE);
	assert_int_equal(check_seq_note(&s, 4), CHECK_SEQ_NEW);
	check_seq_finish(&s, 5);
	assert_int_equal(s.out_of_order, 1); /* one swap, counted once */
	assert_int_equal(s.missing, 0);
	assert_int_equal(s.duplicate, 0);
	assert_int_equal(s.received, 5);
	assert_int_equal(s.events[0].kind, 'o');
	assert_int_equal(s.events[0].seq, 2);
}

static void window_slides_and_far_jumps(void **state)
{
	(void)state;
	struct check_seq s;
	check_seq_init(&s);
	check_seq_note(&s, 0);
	check_seq_note(&s, 5000); /* beyond the window: the gap settles missing */
	check_seq_finish(&s, 5001);
	assert_int_equal(s.missing, 4999);
	assert_int_equal(s.received, 2);

	check_seq_init(&s);
	check_seq_note(&s, 0);
	check_seq_note(&s, 1000000); /* far jump */
	check_seq_finish(&s, 1000001);
	assert_int_equal(s.missing, 999999);
	assert_int_equal(check_seq_note(&s, 3), CHECK_SEQ_DUP); /* settled long ago */

	/* Long clean runs keep the window small; old seqs stay duplicates. */
	check_seq_init(&s);
	for (uint64_t q = 0; q < 3 * CHECK_SEQ_WINDOW; q++)
		check_seq_note(&s, q);
	assert_int_equal(check_seq_note(&s, 17), CHECK_SEQ_DUP);
	assert_int_equal(s.missing, 0);
}

static void unexpected_is_counted(void **state)
{
	(void)state;
	struct check_seq s;
	check_seq_init(&s);
	for (uint64_t q = 0; q < 10; q++)
		check_seq_note(&s, q);
	check_seq_note(&s, 12);
	check_seq_finish(&s, 10); /* the peer only sent 0..9 */
	assert_int_equal(s.unexpected, 1);
	assert_int_equal(s.missing, 0);
	assert_true(check_seq_violations(&s) >= 1);
}

static void widen_immediates(void **state)
{
	(void)state;
	assert_int_equal(check_seq_widen(0, 0), 0);
	assert_int_equal(check_seq_widen(5, 7), 7);
	assert_int_equal(check_seq_widen(5, 3), 3);
	assert_int_equal(check_seq_widen(0x100000005ull, 3), 0x100000003ull);
	assert_int_equal(check_seq_widen(0xfffffff0ull, 0x10), 0x100000010ull);
	assert_int_equal(check_seq_widen(0x100000002ull, 0xfffffffeu), 0xfffffffeull);
	assert_int_equal(check_seq_widen(5, 0xffffffffu), 0xffffffffull);
}

static void counter_words(void **state)
{
	(void)state;
	uint32_t v = 0;
	static const uint32_t vals[] = {0, 1, 7, 0x7fffffff, 0xffffffff};
	for (size_t i = 0; i < sizeof(vals) / sizeof(vals[0]); i++) {
		assert_int_equal(check_counter_decode(check_counter_encode(vals[i]), &v), 1);
		assert_int_equal(v, vals[i]);
	}
	assert_int_equal(check_counter_decode(0, &v), 0); /* zeroed memory */
	/* A torn write (new low half, old high half) is rejected. */
	uint64_t old = check_counter_encode(41), nw = check_counter_encode(42);
	uint64_t torn = (old & 0xffffffff00000000ull) | (nw & 0xffffffffull);
	assert_int_equal(check_counter_decode(torn, &v), 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(clean_buffer_verifies),
		cmocka_unit_test(single_wrong_byte_anywhere_is_counted),
		cmocka_unit_test(wrong_byte_in_large_message),
		cmocka_unit_test(stale_foreign_and_misplaced_data_fail),
		cmocka_unit_test(chunked_fill_matches_whole),
		cmocka_unit_test(in_order_is_clean),
		cmocka_unit_test(duplicate_is_counted),
		cmocka_unit_test(missing_is_counted),
		cmocka_unit_test(out_of_order_is_counted),
		cmocka_unit_test(window_slides_and_far_jumps),
		cmocka_unit_test(unexpected_is_counted),
		cmocka_unit_test(widen_immediates),
		cmocka_unit_test(counter_words),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
