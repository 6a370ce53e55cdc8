/*
 * The spin-wait hint of the CPU SHIFT is built for: PAUSE on x86-64,
 * YIELD on arm64 (both tell the core a spin loop is waiting on another);
 * and statistics counters that a reporting thread reads without the locks
 * their writers hold (relaxed atomics: a plain load or store on x86).
 */
#ifndef SHIFT_BASE_CPU_H
#define SHIFT_BASE_CPU_H

#include <stdint.h>

static inline void shift_cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
	__builtin_ia32_pause();
#elif defined(__aarch64__)
	__asm__ volatile("yield" ::: "memory");
#else
	__atomic_signal_fence(__ATOMIC_SEQ_CST);
#endif
}

#define SHIFT_STAT(x) __atomic_load_n(&(x), __ATOMIC_RELAXED)
/* a counter other threads advance atomically (a QP's rq_tail, sig_tail) */
#define SHIFT_LOAD(x) __atomic_load_n(&(x), __ATOMIC_RELAXED)
#define SHIFT_STAT_SET(x, v) __atomic_store_n(&(x), (v), __ATOMIC_RELAXED)
#define SHIFT_STAT_ADD(x, v) ((void)__atomic_fetch_add(&(x), (v), __ATOMIC_RELAXED))

/*
 * Copy len <= 64 bytes without a call, dst and src not overlapping: two
 * pairs of blocks of the largest power of two not above len (at most 16
 * bytes each, in registers), the second pair ending where the bytes end.
 * For the data path's small copies (inline data), where a call to memcpy
 * would also cost the caller the registers it keeps.
 */
static inline __attribute__((always_inline)) void
shift_copy64(void *restrict dst, const void *restrict src, uint32_t len)
{
	uint8_t *d = dst;
	const uint8_t *s = src;

	if (len >= 16) {
		__builtin_memcpy(d, s, 16);
		__builtin_memcpy(d + len - 16, s + len - 16, 16);
		if (len > 32) {
			__builtin_memcpy(d + 16, s + 16, 16);
			__builtin_memcpy(d + len - 32, s + len - 32, 16);
		}
	} else if (len >= 8) {
		__builtin_memcpy(d, s, 8);
		__builtin_memcpy(d + len - 8, s + len - 8, 8);
	} else if (len >= 4) {
		__builtin_memcpy(d, s, 4);
		__builtin_memcpy(d + len - 4, s + len - 4, 4);
	} else if (len) {
		d[0] = s[0];
		d[len >> 1] = s[len >> 1];
		d[len - 1] = s[len - 1];
	}
}

#endif /* SHIFT_BASE_CPU_H */
