/* Source locations: the user's file and line each IR node was traced at, so that a recompile
 * names the line whose op differs. A location is a small id (0: unknown) interned from a
 * (file, line) pair; the current one is per thread, set by graft_set_location (the C API, and
 * the PyTorch bridge from the Python frame outside torch and graft) and copied into each new
 * node. */
#ifndef GRAFT_LOC_H
#define GRAFT_LOC_H
#include <stddef.h>
#include <stdint.h>

/* The calling thread's current location (0 when none is set). */
uint32_t loc_current(void);
/* The calling thread's current op name (graft_set_op_name; 0 when none): an id of the same
 * table, whose loc_str is the name. */
uint32_t loc_op_current(void);
/* "file:line" of id, or "" for 0 / an unknown id. */
const char *loc_str(uint32_t id, char *buf, size_t n);
/* Counts one recompile at id (not 0); loc_top lists the sites with the most, "file:line (n)"
 * separated by ", ", at most k of them. */
void loc_count_recompile(uint32_t id);
size_t loc_top(char *buf, size_t n, int k);
void loc_reset_counts(void);
/* Frees the table (graft_shutdown); ids held anywhere become unknown. */
void loc_free_all(void);
#endif
