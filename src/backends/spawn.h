/* Running a helper program (the C compiler, Graphviz's dot) without a shell. Private to the
 * backends. */
#ifndef GRAFT_SPAWN_H
#define GRAFT_SPAWN_H

/* Runs argv[0] (searched in PATH) with stdin /dev/null and its stdout and stderr on fd_out;
 * returns the exit status, or -1 if it could not start or died of a signal. */
int spawn_run(char *const argv[], int fd_out);
#endif
