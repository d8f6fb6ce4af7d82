/* Programs: the lowered form backends compile (program.h). */
#include "program.h"
#include "device.h"
#include "dtype.h"
#include "error.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void program_free(exec_program *p) {
  if (!p) return;
  for (int i = 0; i < p->ninstr; i++) free(p->instr[i].in);
  free(p->instr);
  free(p->param_slot);
  free(p->output_slot);
  free(p);
}

exec_buffer *program_instr_buffer(const exec_program *p, const exec_instr *ins) {
  size_t bytes = (size_t)ins->numel * graft_dtype_size(ins->dtype);
  const char *what = ir_ops[ins->op].name;
  exec_buffer *b = buffer_new(bytes, p->device, 0, what);
  if (b || graft_last_status() != GRAFT_ERR_OOM) return b;
  /* buffer_new's message ("out of memory: OP needs N bytes[, U in use, limit L]") or the
   * device's own reason: kept after what it lacks */
  char shp[128], dev[160], prev[400], plain[160];
  snprintf(prev, sizeof prev, "%s", graft_last_error());
  snprintf(plain, sizeof plain, "out of memory: %s needs %zu bytes", what, bytes);
  size_t pl = strlen(plain);
  const char *more = !strncmp(prev, plain, pl) ? prev + pl : prev;
  return err_set(GRAFT_ERR_OOM, "out of memory: %s %s %s on %s needs %zu bytes (%.2f GiB)%s%s", what,
                 ir_shape_str(ins->ndim, ins->shape, shp, sizeof shp), graft_dtype_name(ins->dtype),
                 device_str(p->device, dev, sizeof dev), bytes, (double)bytes / (1u << 30),
                 *more && more == prev ? ": " : "", more);
}
