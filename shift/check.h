/* shiftctl check (check.c): is this host set up for SHIFT? */
#ifndef SHIFT_CHECK_H
#define SHIFT_CHECK_H

/* Report each check on stdout; 0 when all pass, else 1. */
int shiftctl_check(void);

#endif
