/* A compiled program's steps (cpu_code): building them (cpu_codegen.c) and rendering them as
 * text for dumps and reports. The runner is cpu_backend.c's cpu_execute. */
#include "cpu_internal.h"
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

/* Appends element e (es bytes) to array *v of *n elements, capacity *cap; its index, or -1
 * (c->oom set) when out of memory. */
static int steps_push(cpu_code *c, void **v, int *n, int *cap, size_t es, const void *e) {
  if (c->oom) return -1;
  if (*n == *cap) {
    int nc = *cap ? *cap * 2 : 64;
    void *nv = realloc(*v, es * (size_t)nc);
    if (!nv) {
      c->oom = 1;
      return -1;
    }
    *v = nv;
    *cap = nc;
  }
  memcpy((char *)*v + es * (size_t)*n, e, es);
  return (*n)++;
}

int cpu_code_step(cpu_code *c, int kind, int arg) {
  cpu_step s = {kind, arg};
  return steps_push(c, (void **)&c->step, &c->nstep, &c->cap[0], sizeof s, &s);
}
int cpu_code_launch(cpu_code *c, const cpu_launch *l) {
  if (l->nslot > c->max_params) c->max_params = l->nslot;
  return steps_push(c, (void **)&c->launch, &c->nlaunch, &c->cap[1], sizeof *l, l);
}
int cpu_code_slot(cpu_code *c, int slot) {
  return steps_push(c, (void **)&c->slots, &c->nslots, &c->cap[2], sizeof slot, &slot);
}
int cpu_code_gemm(cpu_code *c, const cpu_gemm_call *g) {
  return steps_push(c, (void **)&c->gemm, &c->ngemm, &c->cap[3], sizeof *g, g);
}
int cpu_code_body(cpu_code *c, const cpu_body *b) {
  return steps_push(c, (void **)&c->body, &c->nbody, &c->cap[4], sizeof *b, b);
}

int cpu_code_member(cpu_code *c, int slot) {
  return steps_push(c, (void **)&c->members, &c->nmembers, &c->cap[5], sizeof slot, &slot);
}

void cpu_code_free(cpu_code *c) {
  for (int k = 0; k < c->nbody; k++) free(c->body[k].text);
  free(c->step);
  free(c->launch);
  free(c->slots);
  free(c->gemm);
  free(c->body);
  free(c->members);
  memset(c, 0, sizeof *c);
}

/* The steps as C-like lines ("gemm(0, 111, 112, m, n, k, ...)" in CBLAS's transpose flags);
 * a kernel is named after the first kernel k<N> that had its body (body_kid). */
void cpu_code_render(const cpu_code *c, const exec_program *p, const int *body_kid,
                     rd_sb *out) {
  rd_sb_puts(out, "/* steps */\n");
  for (int k = 0; k < c->nstep; k++) {
    int a = c->step[k].arg;
    switch ((cpu_step_kind)c->step[k].kind) {
    case CPU_STEP_ALLOC: rd_sb_printf(out, "  alloc(%d);\n", a); break;
    case CPU_STEP_RELEASE: rd_sb_printf(out, "  release(%d);\n", a); break;
    case CPU_STEP_FALLBACK:
      rd_sb_printf(out, "  fallback(%d); /* %s */\n", a, ir_ops[p->instr[a].op].name);
      break;
    case CPU_STEP_KERNEL: {
      const cpu_launch *l = &c->launch[a];
      rd_sb_printf(out, "  %s(k%d_, %" PRId64, l->par ? "parallel" : "serial",
                    body_kid[l->body], l->units);
      for (int j = 0; j < l->nslot; j++) rd_sb_printf(out, ", S[%d]", c->slots[l->slot0 + j]);
      rd_sb_puts(out, ");\n");
      break;
    }
    case CPU_STEP_GEMM: {
      const cpu_gemm_call *g = &c->gemm[a];
      if (g->k == 0) {
        rd_sb_printf(out, "  zero(S[%d], %" PRId64 ");\n", g->c, g->numel);
        break;
      }
      rd_sb_printf(out, "  gemm(%d, %d, %d, %" PRId64 ", %" PRId64 ", %" PRId64 ", S[%d], %" PRId64
                    ", %" PRId64 ", S[%d], %" PRId64 ", %" PRId64 ", S[%d], %" PRId64 ", %" PRId64
                    ", %" PRId64 ");\n", g->dbl, g->ta, g->tb, g->m, g->n, g->k, g->a, g->lda,
                    g->sa, g->b, g->ldb, g->sb, g->c, g->ldc, g->sc, g->batch);
      break;
    }
    }
  }
}
