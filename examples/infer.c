/* infer.c: runs a model exported from PyTorch (graft.export) from C, with libgraft alone: no
 * Python, no libtorch.
 *
 *   build/examples/infer MODEL.graft INPUT.f32 [--labels FILE] [--top K] [--logits OUT.f32]
 *
 * MODEL.graft: written by graft.export (examples/export_resnet18.py writes a torchvision
 * resnet18 and an image tensor). INPUT.f32: the model's input as raw float32 (native byte
 * order), in the shape the model was exported with (read from the file). Prints the K classes
 * with the highest logits (names from --labels, one per line, if given); --logits writes all of
 * them as raw float32.
 */
#include "graft.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
  const char *model, *input, *labels, *logits;
  int top;
} options;

static int usage(void) {
  fprintf(stderr, "usage: infer MODEL.graft INPUT.f32 [--labels FILE] [--top K] [--logits OUT.f32]\n");
  return 2;
}

static int parse(int argc, char **argv, options *o) {
  *o = (options){NULL, NULL, NULL, NULL, 5};
  for (int i = 1; i < argc; i++) {
    bool more = i + 1 < argc;
    if (!strcmp(argv[i], "--labels") && more) o->labels = argv[++i];
    else if (!strcmp(argv[i], "--logits") && more) o->logits = argv[++i];
    else if (!strcmp(argv[i], "--top") && more) o->top = atoi(argv[++i]);
    else if (argv[i][0] == '-') return -1;
    else if (!o->model) o->model = argv[i];
    else if (!o->input) o->input = argv[i];
    else return -1;
  }
  return o->model && o->input && o->top > 0 ? 0 : -1;
}

/* The input file's floats: exactly numel of them, or NULL with a message. */
static float *read_input(const char *path, int64_t numel) {
  FILE *fp = fopen(path, "rb");
  if (!fp) {
    perror(path);
    return NULL;
  }
  float *x = malloc(sizeof(float) * (size_t)(numel + 1));
  size_t got = x ? fread(x, sizeof(float), (size_t)numel + 1, fp) : 0;
  fclose(fp);
  if (got != (size_t)numel) {
    fprintf(stderr, "infer: %s holds %s%zu floats; the model takes %lld\n", path,
            got > (size_t)numel ? "more than " : "", got, (long long)numel);
    free(x);
    return NULL;
  }
  return x;
}

/* Line k of the labels file into buf ("class k" without one). */
static const char *label(FILE *fp, int k, char *buf, size_t n) {
  snprintf(buf, n, "class %d", k);
  if (!fp) return buf;
  rewind(fp);
  for (int i = 0; fgets(buf, (int)n, fp); i++)
    if (i == k) {
      buf[strcspn(buf, "\r\n")] = 0;
      return buf;
    }
  snprintf(buf, n, "class %d", k);
  return buf;
}

static void print_top(const float *y, int64_t n, int top, const char *labels) {
  FILE *fp = labels ? fopen(labels, "r") : NULL;
  char *taken = calloc((size_t)n, 1), name[256];
  if (!taken) return;
  for (int r = 0; r < top && r < n; r++) {
    int64_t best = -1;
    for (int64_t i = 0; i < n; i++)
      if (!taken[i] && (best < 0 || y[i] > y[best])) best = i;
    taken[best] = 1;
    printf("%d. %-32s (class %4lld) logit %.6f\n", r + 1, label(fp, (int)best, name, sizeof name),
           (long long)best, y[best]);
  }
  free(taken);
  if (fp) fclose(fp);
}

static int run(const options *o, graft_function *f) {
  graft_dtype dt;
  int64_t shape[GRAFT_MAX_DIMS], numel = 1;
  int nd = graft_function_input(f, 0, &dt, shape);
  if (graft_function_inputs(f) != 1 || graft_function_outputs(f) != 1 || nd < 0 || dt != GRAFT_F32) {
    fprintf(stderr, "infer: %s is not a model of one float32 input and one output\n", o->model);
    return 1;
  }
  for (int d = 0; d < nd; d++) numel *= shape[d];
  float *x = read_input(o->input, numel);
  if (!x) return 1;
  graft_tensor *in = graft_from_host(x, GRAFT_F32, nd, shape, 0), *out = NULL;
  free(x);
  int rc = 1;
  if (in && graft_function_call(f, 1, &in, 1, &out) == GRAFT_OK) {
    int64_t n = graft_numel(out);
    float *y = malloc(sizeof(float) * (size_t)(n + 1));
    if (y && graft_to_host(out, y, sizeof(float) * (size_t)n) == GRAFT_OK) {
      print_top(y, n, o->top, o->labels);
      FILE *fp = o->logits ? fopen(o->logits, "wb") : NULL;
      rc = o->logits && (!fp || fwrite(y, sizeof(float), (size_t)n, fp) != (size_t)n) ? 1 : 0;
      if (fp) fclose(fp);
      if (rc) perror(o->logits);
    }
    free(y);
  }
  if (rc && graft_last_status() != GRAFT_OK) fprintf(stderr, "infer: %s\n", graft_last_error());
  graft_release(out);
  graft_release(in);
  return rc;
}

int main(int argc, char **argv) {
  options o;
  if (parse(argc, argv, &o)) return usage();
  graft_function *f = graft_load(o.model, 0);
  if (!f) {
    fprintf(stderr, "infer: %s\n", graft_last_error());
    return 1;
  }
  int rc = run(&o, f);
  graft_function_free(f);
  graft_shutdown();
  return rc;
}
