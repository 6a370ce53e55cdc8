/*
 * The spin-wait hint of the CPU SHIFT is built for: PAUSE on x86-64,
 * YIELD on arm64 (both tell the core a spin loop is waiting on another);
 * and statistics counters that a reporting thread reads without the locks
 * their writers hold (relaxed atomics: a plain load or store on x86).
 */
#ifndef SHIFT_BASE_CPU_H
#define SHIFT_BASE_CPU_H

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

#endif /* SHIFT_BASE_CPU_H */
