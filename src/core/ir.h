/* IR nodes: op, operands, attributes, dtype, shape and a structural hash computed at
 * construction. A node is immutable once made; nodes are reference counted and shared. */
#ifndef GRAFT_IR_H
#define GRAFT_IR_H
#include "graft.h"
#include "dtype.h"
#include <stdbool.h>
#include <stdint.h>

typedef enum {
#define X(e, ...) IR_##e,
#include "ops.def"
  IR_OP_COUNT
} ir_op;

typedef enum {
  IR_K_LEAF, IR_K_UNARY, IR_K_BINARY, IR_K_COMPARE, IR_K_SELECT,
  IR_K_MOVEMENT, IR_K_REDUCE, IR_K_CONTRACT, IR_K_SPECIAL,
  IR_K_COLLECTIVE /* runs across processes (ops.def): a side effect passes keep in place */
} ir_kind;

/* Dtype classes an op accepts. */
enum {
  IR_D_FLOAT = 1, IR_D_INT = 2, IR_D_BOOL = 4,
  IR_D_NUM = IR_D_FLOAT | IR_D_INT, IR_D_INTBOOL = IR_D_INT | IR_D_BOOL,
  IR_D_ANY = IR_D_FLOAT | IR_D_INT | IR_D_BOOL
};

/* The op table's columns (ops.def explains each). */
typedef enum {
  OPS_API_NONE, OPS_API_OWN, OPS_API_UNARY, OPS_API_UNARY_FLOAT, OPS_API_BINARY
} ops_api_form;
/* Per-element cost of an inlined value, in units of an add (the cpu backend's decisions). */
enum { OPS_COST_MOVE = 0, OPS_COST_CHEAP = 1, OPS_COST_DIV = 4, OPS_COST_TRANS = 16 };
typedef enum {
  OPS_CPU_NONE, OPS_CPU_EXPR, OPS_CPU_WIDE, OPS_CPU_MOVE, OPS_CPU_REDUCE, OPS_CPU_GEMM,
  OPS_CPU_HOST, OPS_CPU_REF
} ops_cpu_path;
typedef enum {
  OPS_INTERP_NONE, OPS_INTERP_LOOP, OPS_INTERP_COPY, OPS_INTERP_HOST, OPS_INTERP_REF
} ops_interp_path;
/* How graft_grad differentiates an op (ops.def's grad column). */
typedef enum { OPS_GRAD_VJP, OPS_GRAD_ZERO, OPS_GRAD_LEAF, OPS_GRAD_NONE } ops_grad;
/* Which float math line (M1 / M2) an op has. */
enum { OPS_MATH_NONE = 0, OPS_MATH_UNARY = 1, OPS_MATH_BINARY = 2 };

typedef struct {
  const char *name;
  int arity;
  ir_kind kind;
  int dtypes;
  ops_api_form api;
  const char *api_fn;  /* "graft_<fn>" for the generated forms; the main function otherwise */
  int cost;
  const char *ref;     /* the reference kernel's name ("ref_unary"), NULL for data leaves */
  ops_cpu_path cpu;
  ops_interp_path interp;
  ops_grad grad;       /* how graft_grad differentiates it (ops.def) */
} ir_opinfo;

extern const ir_opinfo ir_ops[IR_OP_COUNT];
/* OPS_MATH_* per op: whether ops.def gives it a float math line (M1 or M2). */
extern const unsigned char ir_op_math[IR_OP_COUNT];
/* ops.def's math lines as C functions of double, gm_op_<ENUM> (text for generated kernels). */
extern const char ir_op_math_src[];

#define IR_MAX_ATTRS 40
typedef struct {
  int64_t a[IR_MAX_ATTRS]; /* the layouts: ops.def's ATTR lines; read them by name (below) */
  double f;
} ir_attrs;

/* Field offsets from ops.def's ATTR lines (IR_ATTR_<LAYOUT>_<field>) and accessors by name:
 * IR_ATTR(n->attr, CONV2D, groups) is a one-entry field, IR_ATTR_AT(ins->attr, SLICE, limit, d)
 * entry d of a per-dim field. Both are lvalues. */
enum {
#define ATTR(layout, field, off, count) IR_ATTR_##layout##_##field = off,
#include "ops.def"
};
#define IR_ATTR(attrs, layout, field) ((attrs).a[IR_ATTR_##layout##_##field])
#define IR_ATTR_AT(attrs, layout, field, i) ((attrs).a[IR_ATTR_##layout##_##field + (i)])

struct exec_buffer;

typedef struct ir_node ir_node;
struct ir_node {
  int refcnt;
  ir_op op;
  graft_dtype dtype;
  int ndim;
  int64_t shape[GRAFT_MAX_DIMS];
  int64_t numel;
  ir_attrs attr;
  uint64_t lhash;  /* op, attrs, dtype, shape: what the node is, ignoring operands */
  uint64_t hash;   /* lhash combined with the operands' hashes (structural, for CSE) */
  int nattr;       /* attr.a[nattr..] are all zero (0 for data leaves: attrs not hashed) */
  struct exec_buffer *data; /* IR_DATA only: the device data */
  int device;
  uint32_t loc;    /* where it was traced (loc.h; 0 unknown): not hashed */
  uint32_t opname; /* the framework op it came from (loc_op_current; 0 unknown): not hashed */
  uint64_t seq;    /* creation order (not hashed): a sync walks its roots in this order */
  bool computed;   /* IR_DATA made by a sync from pending IR (not an upload): not hashed */
  /* scratch for graph capture; valid only under the global lock during one capture */
  uint64_t mark;
  int32_t slot;
  int nin;
  ir_node *in[]; /* operands */
};

/* Hash mixing (64-bit, splitmix-style finalizer). */
static inline uint64_t ir_mix(uint64_t h, uint64_t v) {
  h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
  h ^= h >> 31; h *= 0xbf58476d1ce4e5b9ull; h ^= h >> 29;
  return h;
}

/* Makes a node after validating operands against the op (dtypes, shapes, attrs); infers the
 * shape for every op but BROADCAST/RESHAPE/CONSTANT/IOTA/RNG/DATA, which take (ndim, shape).
 * out_dtype is used by CONVERT, CONSTANT, IOTA, RNG, DATA; ignored otherwise (-1 ok).
 * Returns a new reference, or NULL with the thread error set. Operands are not consumed. */
ir_node *ir_make(ir_op op, int nin, ir_node *const *in, const ir_attrs *attr,
                 graft_dtype out_dtype, int ndim, const int64_t *shape);
/* ir_make for a node with no operands (CONSTANT, IOTA) on the given device (0..3); a node with
 * operands is on its operands' device and must be given that device. */
ir_node *ir_make_on(ir_op op, int nin, ir_node *const *in, const ir_attrs *attr,
                    graft_dtype out_dtype, int ndim, const int64_t *shape, int device);
/* A data leaf over buf (takes a reference to buf). */
ir_node *ir_make_data(struct exec_buffer *buf, graft_dtype dt, int ndim, const int64_t *shape,
                      int device);
/* A node of op with the given fields over in[0..nin), without checks or shape inference: for
 * replaying a computation recorded from checked nodes (graft_function_call). Retains in. */
ir_node *ir_make_raw(ir_op op, graft_dtype dt, int ndim, const int64_t *shape,
                     const ir_attrs *attr, int device, uint32_t loc, int nin, ir_node *const *in);
void ir_retain(ir_node *n);
void ir_release(ir_node *n);
/* Pending (non-leaf-data) nodes alive now. */
int64_t ir_pending_count(void);
/* Collective nodes alive now (pending: a collective never becomes data itself). */
int64_t ir_collective_count(void);
/* Writes "[2,3]" into buf. */
const char *ir_shape_str(int ndim, const int64_t *shape, char *buf, size_t n);
/* Writes one line describing the node's attributes (empty when none). */
void ir_attr_str(const ir_node *n, char *buf, size_t size);
/* The same from the parts a program instruction keeps (nd: dims of operand 0, else its own). */
void ir_attr_fmt(ir_op op, const ir_attrs *attr, int nd, char *buf, size_t size);
int64_t ir_numel(int ndim, const int64_t *shape);
#endif
