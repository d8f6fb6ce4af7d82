/* Optimizers for training from C: SGD (momentum, dampening, weight decay, Nesterov) and
 * Adam / AdamW, as torch.optim computes them (the same formulas in the same order, so a C loop
 * and a PyTorch one agree to rounding). An update is IR like the forward: each parameter and
 * state tensor takes its new value by graft_assign, so forward, gradients and update are one
 * graph at the next sync, and the old values' buffers are reused by it. What changes per step
 * (the learning rate, Adam's bias corrections) enters as graft_scalar parameters, so every
 * step after the first runs the same compiled graph. */
#include "graft.h"
#include "composite.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef enum { OPT_SGD, OPT_ADAM } opt_kind;

struct graft_optimizer {
  opt_kind kind;
  graft_sgd_options sgd;
  graft_adam_options adam;
  int n;
  int64_t *steps;          /* per parameter: the updates it had (torch.optim's state['step']) */
  graft_tensor **params;   /* the caller's handles, retained: assigned in place */
  graft_tensor **m, **v;   /* SGD: momentum buffers (m; NULL until the first step); Adam: moments */
};

static void opt_free_arrays(graft_optimizer *o) {
  for (int i = 0; i < o->n; i++) {
    if (o->params) graft_release(o->params[i]);
    if (o->m) graft_release(o->m[i]);
    if (o->v) graft_release(o->v[i]);
  }
  free(o->params), free(o->m), free(o->v), free(o->steps);
}

void graft_optimizer_free(graft_optimizer *o) {
  if (!o) return;
  opt_free_arrays(o);
  free(o);
}

/* Zero tensors like each parameter into m and v, as data (uploaded zeros: no graph to compile,
 * and the first step's graph is every later step's), in no scope: the optimizer owns them. */
static graft_status opt_zero_state(graft_optimizer *o) {
  graft_status st = GRAFT_OK;
  graft_scope_begin();
  for (int i = 0; i < o->n && st == GRAFT_OK; i++) {
    graft_tensor *p = o->params[i];
    int64_t s[GRAFT_MAX_DIMS], numel = graft_numel(p);
    int nd = graft_shape(p, s);
    graft_dtype dt = graft_get_dtype(p);
    void *zeros = calloc((size_t)(numel > 0 ? numel : 1), graft_dtype_size(dt));
    if (!zeros) {
      err_set(GRAFT_ERR_OOM, "out of memory");
      st = GRAFT_ERR_OOM;
      break;
    }
    graft_tensor *m = graft_from_host(zeros, dt, nd, s, graft_device(p));
    graft_tensor *v = graft_from_host(zeros, dt, nd, s, graft_device(p));
    free(zeros);
    if (!m || !v) st = graft_last_status();
    else o->m[i] = graft_retain(m), o->v[i] = graft_retain(v);
  }
  graft_scope_end();
  return st;
}

static graft_optimizer *opt_new(const char *fn, opt_kind kind, int n, graft_tensor *const *params) {
  if (n < 1 || !params) {
    err_set(n < 1 ? GRAFT_ERR_ARG : GRAFT_ERR_NULL, "%s: %s", fn, n < 1 ? "no parameters" : "params is NULL");
    return NULL;
  }
  for (int i = 0; i < n; i++) {
    if (comp_bad_input(fn, "a parameter", params[i])) return NULL;
    graft_dtype dt = graft_get_dtype(params[i]);
    if (dt != GRAFT_F32 && dt != GRAFT_F64) {
      err_set(GRAFT_ERR_DTYPE, "%s: params[%d] is %s; parameters are f32 or f64", fn, i,
              graft_dtype_name(dt));
      return NULL;
    }
  }
  graft_optimizer *o = calloc(1, sizeof *o);
  if (!o || !(o->params = calloc((size_t)n, sizeof *o->params)) ||
      !(o->m = calloc((size_t)n, sizeof *o->m)) || !(o->v = calloc((size_t)n, sizeof *o->v)) ||
      !(o->steps = calloc((size_t)n, sizeof *o->steps))) {
    if (o) free(o->params), free(o->m), free(o->v), free(o->steps);
    free(o);
    err_set(GRAFT_ERR_OOM, "%s: out of memory", fn);
    return NULL;
  }
  o->kind = kind, o->n = n;
  for (int i = 0; i < n; i++) o->params[i] = graft_retain(params[i]);
  return o;
}

graft_optimizer *graft_sgd(int n, graft_tensor *const *params, graft_sgd_options opt) {
  const char *fn = "graft_sgd";
  if (!(opt.lr >= 0) || !(opt.momentum >= 0) || !(opt.weight_decay >= 0) || !(opt.dampening >= 0)) {
    err_set(GRAFT_ERR_ARG, "%s: lr, momentum, dampening and weight_decay must be >= 0", fn);
    return NULL;
  }
  if (opt.nesterov && (opt.momentum <= 0 || opt.dampening != 0)) {
    err_set(GRAFT_ERR_ARG, "%s: Nesterov momentum needs momentum > 0 and dampening 0", fn);
    return NULL;
  }
  graft_optimizer *o = opt_new(fn, OPT_SGD, n, params);
  if (o) o->sgd = opt;
  return o;
}

graft_optimizer *graft_adam(int n, graft_tensor *const *params, graft_adam_options opt) {
  const char *fn = opt.decoupled_weight_decay ? "graft_adam (AdamW)" : "graft_adam";
  if (!(opt.lr >= 0) || !(opt.eps >= 0) || !(opt.weight_decay >= 0) || !(opt.beta1 >= 0) ||
      !(opt.beta1 < 1) || !(opt.beta2 >= 0) || !(opt.beta2 < 1)) {
    err_set(GRAFT_ERR_ARG, "%s: lr, eps and weight_decay must be >= 0, betas in [0, 1)", fn);
    return NULL;
  }
  graft_optimizer *o = opt_new(fn, OPT_ADAM, n, params);
  if (!o) return NULL;
  o->adam = opt;
  if (opt_zero_state(o) != GRAFT_OK) {
    graft_optimizer_free(o);
    err_rename(fn);
    return NULL;
  }
  return o;
}

graft_status graft_optimizer_set_lr(graft_optimizer *o, double lr) {
  if (!o) return err_set(GRAFT_ERR_NULL, "graft_optimizer_set_lr: optimizer is NULL"), GRAFT_ERR_NULL;
  if (!(lr >= 0))
    return err_set(GRAFT_ERR_ARG, "graft_optimizer_set_lr: lr %g < 0", lr), GRAFT_ERR_ARG;
  if (o->kind == OPT_SGD) o->sgd.lr = lr;
  else o->adam.lr = lr;
  return GRAFT_OK;
}

/* A per-step value as a graph parameter of p's dtype and device (no recompile when it changes). */
static graft_tensor *opt_scalar(double v, graft_tensor *p) {
  return graft_scalar_on(v, graft_get_dtype(p), graft_device(p));
}

/* torch.optim.SGD: g += wd p; buf = g (first step) or momentum buf + (1 - dampening) g;
 * g = nesterov ? g + momentum buf : buf; p -= lr g. */
static graft_status opt_sgd_one(graft_optimizer *o, int i, graft_tensor *g) {
  const graft_sgd_options *s = &o->sgd;
  graft_tensor *p = o->params[i];
  if (s->weight_decay) g = graft_add(g, graft_mul_scalar(p, s->weight_decay));
  if (s->momentum && !o->m[i]) { /* the first step: the buffer is the gradient itself */
    int64_t sh[GRAFT_MAX_DIMS];
    int nd = graft_shape(g, sh);
    graft_tensor *buf = graft_broadcast_to(g, nd, sh); /* a handle of its own on g's value */
    if (!buf) return graft_last_status();
    o->m[i] = graft_retain(buf); /* outlives the step's scope */
  } else if (s->momentum) {
    graft_tensor *buf =
        graft_add(graft_mul_scalar(o->m[i], s->momentum), graft_mul_scalar(g, 1 - s->dampening));
    if (!buf || graft_assign(o->m[i], buf)) return graft_last_status();
  }
  if (s->momentum)
    g = s->nesterov ? graft_add(g, graft_mul_scalar(o->m[i], s->momentum)) : o->m[i];
  graft_tensor *np = graft_sub(p, graft_mul(g, opt_scalar(s->lr, p)));
  return np ? graft_assign(p, np) : graft_last_status();
}

/* torch.optim.Adam / AdamW (single-tensor form): AdamW p *= 1 - lr wd, Adam g += wd p;
 * m = lerp(m, g, 1 - beta1); v = beta2 v + (1 - beta2) g g;
 * p -= lr / (1 - beta1^t) m / (sqrt(v) / sqrt(1 - beta2^t) + eps). */
static graft_status opt_adam_one(graft_optimizer *o, int i, graft_tensor *g) {
  const graft_adam_options *a = &o->adam;
  graft_tensor *p = o->params[i], *base = p;
  double t = (double)o->steps[i];
  if (a->weight_decay && a->decoupled_weight_decay)
    base = graft_mul(p, opt_scalar(1 - a->lr * a->weight_decay, p));
  else if (a->weight_decay)
    g = graft_add(g, graft_mul_scalar(p, a->weight_decay));
  graft_tensor *m = graft_add(o->m[i], graft_mul_scalar(graft_sub(g, o->m[i]), 1 - a->beta1));
  graft_tensor *v = graft_add(graft_mul_scalar(o->v[i], a->beta2),
                              graft_mul_scalar(graft_mul(g, g), 1 - a->beta2));
  if (!m || !v || graft_assign(o->m[i], m) || graft_assign(o->v[i], v)) return graft_last_status();
  graft_tensor *step_size = opt_scalar(a->lr / (1 - pow(a->beta1, t)), p);
  graft_tensor *bc2_sqrt = opt_scalar(sqrt(1 - pow(a->beta2, t)), p);
  graft_tensor *denom = graft_add_scalar(graft_div(graft_sqrt(o->v[i]), bc2_sqrt), a->eps);
  graft_tensor *np = graft_sub(base, graft_mul(step_size, graft_div(o->m[i], denom)));
  return np ? graft_assign(p, np) : graft_last_status();
}

graft_status graft_optimizer_step(graft_optimizer *o, graft_tensor *const *grads) {
  const char *fn = "graft_optimizer_step";
  if (!o || !grads)
    return err_set(GRAFT_ERR_NULL, "%s: %s is NULL", fn, o ? "grads" : "optimizer"), GRAFT_ERR_NULL;
  for (int i = 0; i < o->n; i++) { /* check all before changing any */
    if (!grads[i]) continue;
    if (comp_bad_input(fn, "a gradient", grads[i])) return graft_last_status();
    int64_t a[GRAFT_MAX_DIMS], b[GRAFT_MAX_DIMS];
    int na = graft_shape(o->params[i], a), nb = graft_shape(grads[i], b);
    if (na < 0) return err_rename(fn), graft_last_status();
    if (na != nb || memcmp(a, b, sizeof(int64_t) * (size_t)na) ||
        graft_get_dtype(grads[i]) != graft_get_dtype(o->params[i]) ||
        graft_device(grads[i]) != graft_device(o->params[i]))
      return err_set(GRAFT_ERR_SHAPE, "%s: grads[%d] does not match params[%d] (shape, dtype or "
                     "device)", fn, i, i), GRAFT_ERR_SHAPE;
  }
  for (int i = 0; i < o->n; i++) o->steps[i] += grads[i] != NULL;
  graft_status st = GRAFT_OK;
  graft_scope_begin();
  for (int i = 0; i < o->n && st == GRAFT_OK; i++)
    if (grads[i]) st = o->kind == OPT_SGD ? opt_sgd_one(o, i, grads[i]) : opt_adam_one(o, i, grads[i]);
  graft_scope_end();
  if (st != GRAFT_OK) err_rename(fn);
  return st;
}
