/* A shared library that is not a libibverbs (tests/dropin/noreal.sh). */
int shift_test_noverbs(void);

int shift_test_noverbs(void)
{
	return 0;
}
