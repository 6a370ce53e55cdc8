/*
 * SHIFT's own code and data made resident before a failure needs them.
 *
 * The failover path runs for the first time when a NIC fails: none of its
 * pages has been touched by then, and on a long job the library's cold
 * pages may have left the page cache. Each first touch is a page fault,
 * read from disk (or, on the testbed, from the host over 9p) on the
 * switch's critical path. The background thread faults in every page of
 * the object SHIFT is built into once, when it first has nothing to
 * replay, so that a failover's faults are taken before there is one.
 * Nothing is locked in memory (mlock would count against RLIMIT_MEMLOCK,
 * the application's budget for its memory registrations), so under
 * memory pressure the kernel may reclaim these clean pages again.
 */
#ifndef SHIFT_BASE_PREFAULT_H
#define SHIFT_BASE_PREFAULT_H

#include <stddef.h>

/* Fault in every page of the file-backed, readable part of each loaded
 * segment of the object (executable or shared library) holding addr, as
 * reading them would (MADV_POPULATE_READ: never a SIGBUS, nothing done on
 * a kernel older than 5.14). The number of pages made resident (0: no
 * loaded object holds addr, or the kernel cannot). */
size_t shift_prefault_object(const void *addr);

/* The same for the object SHIFT is built into. */
size_t shift_prefault_self(void);

#endif /* SHIFT_BASE_PREFAULT_H */
