/* A module of 4 MiB of read-only data nobody reads until test_prefault
 * has it prefaulted: its pages are not mapped before. */
const unsigned char shift_test_cold[4u << 20] = { 1 };
