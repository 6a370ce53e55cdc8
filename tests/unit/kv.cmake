# kv/ unit tests: test_kv (URL/namespace parsing, in-memory backend) and
# test_kv_redis (Redis backend against a real redis-server that the test
# starts on a free 127.0.0.1 port; it fails, never skips, without one).
shift_unit_test(test_kv
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_kv.c
  LIBS shift_kv)
shift_unit_test(test_kv_redis
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_kv_redis.c
  LIBS shift_kv)
