/* Programs: the lowered form backends compile (program.h). */
#include "program.h"
#include <stdlib.h>

void program_free(exec_program *p) {
  if (!p) return;
  for (int i = 0; i < p->ninstr; i++) free(p->instr[i].in);
  free(p->instr);
  free(p->param_slot);
  free(p->output_slot);
  free(p);
}
