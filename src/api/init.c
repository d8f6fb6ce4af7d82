/* Parameter initialization for models written in C, as torch.nn.init draws it (the bounds and
 * fans of its formulas; the numbers come from graft's generator, seeded by graft_manual_seed).
 * Each result is computed before it returns: a parameter is data, not a pending draw. */
#include "graft.h"
#include "composite.h"
#include <math.h>

/* x computed now, in the caller's scope; NULL (error named fn) on failure. */
static graft_tensor *init_done(const char *fn, graft_tensor *x) {
  if (x && graft_sync(&x, 1) != GRAFT_OK) x = NULL;
  return comp_finish(fn, x);
}

static bool init_check(const char *fn, graft_dtype dt, int ndim, const int64_t *shape) {
  if (dt != GRAFT_F32 && dt != GRAFT_F64) {
    err_set(GRAFT_ERR_DTYPE, "%s: parameters are f32 or f64, not %s", fn, graft_dtype_name(dt));
    return false;
  }
  if (ndim < 0 || ndim > GRAFT_MAX_DIMS || (ndim && !shape)) {
    err_set(GRAFT_ERR_SHAPE, "%s: ndim %d or its shape is not valid", fn, ndim);
    return false;
  }
  return true;
}

/* scale * draw + shift, the draw uniform in [0, 1) or standard normal. */
static graft_tensor *init_draw(const char *fn, int dist, graft_dtype dt, int ndim,
                               const int64_t *shape, double scale, double shift, int device) {
  if (!init_check(fn, dt, ndim, shape)) return NULL;
  graft_scope_begin();
  graft_tensor *u = dist ? graft_rand_normal_on(dt, ndim, shape, device)
                         : graft_rand_uniform_on(dt, ndim, shape, device);
  return init_done(fn, graft_add_scalar(graft_mul_scalar(u, scale), shift));
}

graft_tensor *graft_init_uniform(graft_dtype dt, int ndim, const int64_t *shape, double lo,
                                 double hi, int device) {
  return init_draw("graft_init_uniform", 0, dt, ndim, shape, hi - lo, lo, device);
}

graft_tensor *graft_init_normal(graft_dtype dt, int ndim, const int64_t *shape, double mean,
                                double std, int device) {
  return init_draw("graft_init_normal", 1, dt, ndim, shape, std, mean, device);
}

graft_tensor *graft_init_kaiming_uniform(graft_dtype dt, int ndim, const int64_t *shape, double a,
                                         int device) {
  const char *fn = "graft_init_kaiming_uniform";
  if (!init_check(fn, dt, ndim, shape)) return NULL;
  if (ndim < 2) {
    err_set(GRAFT_ERR_SHAPE, "%s: a weight has at least 2 dims [out, in, ...], got %d", fn, ndim);
    return NULL;
  }
  int64_t fan_in = shape[1]; /* torch.nn.init: in-features times the receptive field */
  for (int d = 2; d < ndim; d++) fan_in *= shape[d];
  if (fan_in < 1) {
    err_set(GRAFT_ERR_SHAPE, "%s: the fan-in is 0", fn);
    return NULL;
  }
  double gain = sqrt(2.0 / (1 + a * a)), bound = gain * sqrt(3.0 / (double)fan_in);
  return graft_init_uniform(dt, ndim, shape, -bound, bound, device);
}
