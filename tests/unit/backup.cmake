# Backup auto-pick on fake device lists (shift/shadow/backup.c).
shift_unit_test(test_backup SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_backup.c LIBS shift_core)
