/*
 * Logging. One line per event on stderr, prefixed "shift:" and the level.
 * The level comes from SHIFT_LOG_LEVEL (error, warn, info, debug; default
 * warn). A disabled level costs one predictable branch on a global, and the
 * data path logs nothing at the default level. The macros keep errno intact,
 * so a verb can log and still return its errno.
 */
#ifndef SHIFT_LOG_H
#define SHIFT_LOG_H

#include <errno.h>

enum shift_log_level {
	SHIFT_LOG_ERROR,
	SHIFT_LOG_WARN,
	SHIFT_LOG_INFO,
	SHIFT_LOG_DEBUG,
};

extern enum shift_log_level shift_log_level;

void shift_log_emit(enum shift_log_level level, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));

#define shift_likely(x) __builtin_expect(!!(x), 1)
#define shift_unlikely(x) __builtin_expect(!!(x), 0)

#define shift_log(level, ...)                                            \
	do {                                                             \
		if (shift_unlikely((level) <= shift_log_level)) {        \
			int shift_log_errno_ = errno;                    \
			shift_log_emit((level), __VA_ARGS__);            \
			errno = shift_log_errno_;                        \
		}                                                        \
	} while (0)

#define shift_err(...) shift_log(SHIFT_LOG_ERROR, __VA_ARGS__)
#define shift_warn(...) shift_log(SHIFT_LOG_WARN, __VA_ARGS__)
#define shift_info(...) shift_log(SHIFT_LOG_INFO, __VA_ARGS__)
#define shift_debug(...) shift_log(SHIFT_LOG_DEBUG, __VA_ARGS__)

/* Parse "error|warn|info|debug" (or 0..3). Returns 0, or -1 if unknown. */
int shift_log_level_parse(const char *s, enum shift_log_level *out);
const char *shift_log_level_name(enum shift_log_level level);

#endif /* SHIFT_LOG_H */
